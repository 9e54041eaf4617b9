"""End to end through the real CLI, on a cluster that only needs its plays to run: the host
key refused on every path, the controller's secrets kept out of the state directory, the
per-cluster lock, a killed controller and a node lost mid-play.

None of this depends on what the plays install, so the cluster is not tests/e2e/
test_docker_cluster.py's full-stack one (an hour of that file's worker): two local nodes
bootstrapped with the preflight and driver plays from the signed fixture repository
(tests/fixtures/aptrepo.py: FIXTURE driver packages under NVIDIA's names, real apt, real
pins and holds), which the suite's other worker runs beside that file. The driver play is
the one the faults strike: it installs and holds the GPU packages, as on every node.
The tests run in file order; the faults come last (a node stopped and started again gets
another SSH port from Docker).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, cluster_dir, labelled, node_sh
from tests.fixtures import aptrepo

pytestmark = pytest.mark.e2e

# The lock of a local node from a mirror (gpuprov/data/stack.toml): R580, open modules.
DRIVER = "580.159.04"
TAGS = "preflight,driver"
# The probes of what the driver play does (gpuprov/probes/test_stack.py, marker driver).
DRIVER_PROBES = ("driver_packages_match_the_lock", "gpu_packages_are_held", "nouveau_blacklisted")


@pytest.fixture(scope="module")
def repo():
    from gpuprov.providers.docker import bridge_gateway

    repos = aptrepo.start(bridge_gateway(), [DRIVER])
    yield repos
    repos.close()


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], repo):
    """Two local nodes, bootstrapped with the preflight and driver plays from the fixture
    mirror: (name, `up`'s JSON, its stderr)."""
    name = f"flt-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--source", "mirror",
                       "--mirror-url", repo.good_url, "--mirror-key-fingerprint", repo.fingerprint,
                       "--tags", TAGS, "--health", "off", "-o", "json", env=env, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        data = json.loads(proc.stdout)
        assert data["bootstrap"]["ok"] is True, data["bootstrap"]
        yield name, data, proc.stderr
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def test_the_driver_play_installed_and_held_the_locks_packages(cluster, env) -> None:
    """What the faults below strike: the lock's driver packages installed and held."""
    name, data, _ = cluster
    lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert (lock["source"], lock["driver"]) == ("mirror", DRIVER), lock
    for node in (n["name"] for n in data["nodes"]):
        assert set(lock["packages"]["driver"]) <= set(node_sh(node, "apt-mark showhold").split()), node
        assert data["bootstrap"]["hosts"][node]["changed"] > 0


def test_exec_runs_everywhere_with_prefixed_output(cluster, env) -> None:
    name, _, _ = cluster
    proc = run_cli("exec", name, "--", "uname", "-r", env=env)
    assert proc.returncode == 0, proc.stderr
    kernel = os.uname().release  # container nodes share this machine's kernel
    lines = sorted(proc.stdout.splitlines())
    assert lines == sorted([f"{name}-node-1 | {kernel}", f"{name}-node-2 | {kernel}"])
    proc = run_cli("exec", name, "--", "sh", "-c", "exit 7", env=env)
    assert proc.returncode == 1 and "exit 7" in proc.stderr


def test_an_operators_own_granted_key_logs_in_and_once_revoked_is_refused(cluster, env, tmp_path) -> None:
    """Issue 57: bob, an operator who did not make the cluster, has its record and pinned host
    keys but not its private key. His own public key granted (`access grant`) and applied by the
    next `provision`, gpuprov logs in with his own key (GPUPROV_IDENTITY) by every path: `exec`
    (paramiko), `ssh` (OpenSSH); without it, nothing logs in. Revoked and applied, his key is
    refused on every node, and the cluster's own key still logs in."""
    name, data, _ = cluster
    nodes = sorted(n["name"] for n in data["nodes"])
    bob = tmp_path / "bob_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bob@laptop", "-f", str(bob)], check=True)
    granted = run_cli("access", "grant", name, "--key", f"{bob}.pub", "--as", "bob", env=env)
    assert granted.returncode == 0, granted.stderr
    applied = run_cli("provision", name, "--tags", "preflight", "-o", "json", env=env, timeout=600)
    assert applied.returncode == 0, applied.stderr[-2000:]
    key = cluster_dir(env, name) / "id_ed25519"
    away = key.with_name("id_ed25519.away")
    as_bob = {**env, "GPUPROV_IDENTITY": str(bob)}

    def on_bobs_machine(check) -> None:
        _close_masters(name)  # no connection the maker's key opened carries bob's commands
        key.rename(away)
        try:
            check()
        finally:
            away.rename(key)

    def logs_in() -> None:
        proc = run_cli("exec", name, "--", "sh", "-c", "grep -c ' gpuprov-access:bob$' .ssh/authorized_keys",
                       env=as_bob)
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == [f"{n} | 1" for n in nodes], proc.stdout
        one = run_cli("ssh", name, nodes[1], "--", "hostname -s", env=as_bob)
        assert one.returncode == 0 and one.stdout.strip() == nodes[1], one.stderr
        assert run_cli("exec", name, "--", "true", env=env).returncode != 0  # no key of his named

    on_bobs_machine(logs_in)
    assert run_cli("access", "revoke", name, "--as", "bob", env=env).returncode == 0
    applied = run_cli("provision", name, "--tags", "preflight", "-o", "json", env=env, timeout=600)
    assert applied.returncode == 0, applied.stderr[-2000:]

    def refused() -> None:
        proc = run_cli("exec", name, "--", "true", env=as_bob)
        assert proc.returncode != 0 and all(n in proc.stderr for n in nodes), proc.stderr
        assert run_cli("ssh", name, nodes[0], "--", "true", env=as_bob).returncode != 0

    on_bobs_machine(refused)
    assert run_cli("exec", name, "--", "true", env=env).returncode == 0  # the maker's key still logs in


def _close_masters(name: str) -> None:
    """Close the cluster's multiplexed SSH connections (opened earlier, after a checked key),
    so that the next command makes a fresh connection and meets the node's key as it is now."""
    cp = Path.home() / ".ansible" / "cp" / name
    for sock in cp.glob("*") if cp.is_dir() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True,
                       check=False)


def test_changed_host_key_is_refused(cluster, env, tmp_path) -> None:
    """A node that suddenly presents another host key (an impostor) is refused by every path:
    exec (paramiko), Ansible (provision, patch, the bootstrap of `up`), the probes (verify),
    and the SSH wait. Trust review finding 1: ansible-runner's environment had turned host key
    checking off, and provision ran its tasks on the impostor."""
    name, data, _ = cluster
    node = data["nodes"][0]["name"]
    other = data["nodes"][1]["name"]
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    key = "/etc/ssh/ssh_host_ed25519_key"
    saved = tmp_path / "original_key"
    subprocess.run(["docker", "cp", f"{cid}:{key}", str(saved)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")],
                   check=True)

    def install(private: Path) -> None:
        subprocess.run(["docker", "cp", str(private), f"{cid}:{key}"], check=True)
        subprocess.run(["docker", "exec", cid, "sh", "-c",
                        f"chown root:root {key} && chmod 600 {key} && systemctl restart ssh"],
                       check=True)

    install(tmp_path / "impostor")
    _close_masters(name)
    # Even an environment that asks for host key checking off gets it on.
    hostile = {**env, "ANSIBLE_HOST_KEY_CHECKING": "False"}
    try:
        proc = run_cli("exec", name, "--", "true", env=env)
        assert proc.returncode == 1
        assert f"{node}: BadHostKeyException" in proc.stderr, proc.stderr
        cdir = cluster_dir(env, name)
        play = subprocess.run(
            [str(Path(sys.executable).parent / "ansible"), "-i", str(cdir / "inventory.yml"), node,
             "-m", "ansible.builtin.ping"],
            capture_output=True, text=True, check=False,
            # a fresh connection: a ControlPersist master opened earlier would skip the check
            # (in a short directory: a control socket path must stay under 108 bytes)
            env={**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg"),
                 "ANSIBLE_SSH_CONTROL_PATH_DIR": tempfile.mkdtemp(prefix="cp", dir="/tmp")},
        )
        assert play.returncode != 0
        # ssh's own words under Ansible's linear strategy, Mitogen's under its strategy (the
        # e2e units' default, tests/suite_strategy.py; its words: tests/unit/test_ansible_strategy.py)
        refused = ("Host key checking is enabled, and SSH reported an unrecognized or mismatching host key"
                   if env["GPUPROV_ANSIBLE_STRATEGY"] == "mitogen" else "Host key verification failed")
        assert refused in play.stdout + play.stderr, play.stdout

        mismatch = "host key does not match the pinned key"
        proc = run_cli("provision", name, "--tags", "preflight", "-o", "json", env=hostile)
        assert proc.returncode == 1, proc.stderr
        assert f"{node}: UNREACHABLE {mismatch}" in proc.stderr, proc.stderr
        hosts = json.loads(proc.stdout)["hosts"]
        assert hosts[node]["tasks"] == 0 and hosts[node]["unreachable"] >= 1
        assert hosts[other]["tasks"] > 0 and hosts[other]["failed"] == 0  # the good node is served

        proc = run_cli("patch", name, "--kernel", "--check", "-o", "json", env=hostile)
        assert proc.returncode == 1, proc.stderr
        assert mismatch in json.loads(proc.stdout)["hosts"][node]["plan_error"]

        proc = run_cli("verify", name, "-o", "json", env=hostile)
        assert proc.returncode == 1, proc.stderr
        failed = [p for p in json.loads(proc.stdout)["hosts"][node] if p["status"] == "fail"]
        assert failed and all("Host key verification failed" in p["detail"] for p in failed), failed

        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, env=hostile)
        assert proc.returncode == 1, proc.stderr
        assert f"{node}: host key does not match the pinned key" in proc.stderr, proc.stderr
        status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
        assert status["failed_step"] == "reach"
    finally:
        install(saved)
    assert run_cli("exec", name, "--", "true", env=env).returncode == 0


def test_no_secret_of_the_controller_reaches_the_state_dir(cluster, env) -> None:
    """Trust review finding 7: ansible-runner wrote the controller's whole environment into
    each run's artifacts. Canary secrets in the environment must appear nowhere in the state dir."""
    name, _, _ = cluster
    canaries = {"AWS_SECRET_ACCESS_KEY": f"canary-aws-{secrets.token_hex(8)}",
                "GPUPROV_REGISTRY_PASSWORD": f"canary-registry-{secrets.token_hex(8)}",
                "SOME_API_TOKEN": f"canary-token-{secrets.token_hex(8)}"}
    proc = run_cli("provision", name, "--tags", "preflight", env={**env, **canaries})
    assert proc.returncode == 0, proc.stderr
    found = subprocess.run(["grep", "-rl", "-e", "canary-", env["GPUPROV_HOME"]],
                           capture_output=True, text=True, check=False)
    assert found.returncode == 1 and found.stdout == "", found.stdout
    # ... and the run did look at the environment it was given: the runner's own record of it
    # exists, with host key checking forced on.
    run = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"][0]
    command = json.loads((Path(run["artifact_dir"]) / "artifacts" / "ansible" / "command").read_text())
    assert command["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "AWS_SECRET_ACCESS_KEY" not in command["env"]


def test_nodes_of_another_state_dir_are_never_adopted(cluster, env, tmp_path) -> None:
    name, _, _ = cluster
    other = {**env, "GPUPROV_HOME": str(tmp_path / "other-home")}
    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, env=other)
    assert proc.returncode == 2 and "this state directory does not know them" in proc.stderr
    containers, _ = labelled(name)
    assert len(containers) == 2
    assert run_cli("exec", name, "--", "true", env=env).returncode == 0


def test_down_finds_nodes_whose_state_was_lost(env, tmp_path) -> None:
    name = f"lost-{secrets.token_hex(3)}"
    lost_home = {**env, "GPUPROV_HOME": str(tmp_path / "lost-home")}
    try:
        run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap",
                env=lost_home, check=True)
        assert len(labelled(name)[0]) == 1
        fresh = {**env, "GPUPROV_HOME": str(tmp_path / "fresh-home")}
        proc = run_cli("down", name, "--yes", env=fresh)
        assert proc.returncode == 0 and "unrecorded docker node(s) removed" in proc.stderr
        assert labelled(name) == ([], [])
    finally:
        cleanup_labels(name)


# -- faults that hold (issue 30, item 4): a second command, a killed controller, a lost node ----
# Each runs the driver play alone (`provision --tags driver`: it installs and holds the GPU
# packages) on the cluster's two bootstrapped nodes, and leaves them converged. They come last
# before `down`: a node stopped and started again gets another SSH port from Docker, which the
# tests above read from the first `up`.
SINCE = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class _Running:
    """A gpuprov command running in the background (as an operator's other shell runs it); its
    progress (stderr) read line by line as it comes, so a test acts on what it has seen."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.stdout = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuprov", *args], stdout=self.stdout,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")  # the end
            self.changed.notify_all()

    def wait_for_role(self, nodes: list[str], role: str) -> None:
        """Until the progress shows ``role``'s tasks running on every one of ``nodes``."""
        def seen() -> bool:
            return all(f"  {node}: {role}" in self.lines for node in nodes)

        with self.changed:
            self.changed.wait_for(lambda: seen() or self.lines[-1:] == [""], timeout=600)
            assert seen(), "\n".join(self.lines)

    def finish(self) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=600)
        self.reader.join(timeout=60)
        self.stdout.seek(0)
        return code, self.stdout.read(), "\n".join(self.lines)


def _node_names(env: dict[str, str], name: str) -> list[str]:
    return [n["name"] for n in json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["nodes"]]


def _held(nodes: list[str]) -> dict[str, list[str]]:
    return {node: sorted(node_sh(node, "apt-mark showhold").split()) for node in nodes}


def _converged(proc: subprocess.CompletedProcess[str], nodes: list[str]) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] is True and set(result["hosts"]) == set(nodes), result
    assert all(s["failed"] == 0 and s["unreachable"] == 0 and s["tasks"] > 0 for s in result["hosts"].values())


def test_a_second_provision_is_refused_at_once_naming_the_holder(cluster, env) -> None:
    """The per-cluster lock: a `provision` started while another runs on the nodes is refused
    (exit 1, one line) naming the holder's command, pid and since when; the first goes on
    undisturbed and converges."""
    name, _, _ = cluster
    nodes = _node_names(env, name)
    first = _Running("provision", name, "--tags", "driver", "-o", "json", env=env)
    try:
        first.wait_for_role(nodes, "gpuprov_base")
        second = run_cli("provision", name, "--tags", "driver", "-o", "json", env=env)
    finally:
        code, out, err = first.finish()
    assert second.returncode == 1 and second.stdout == "", second.stdout
    assert re.fullmatch(rf"gpuprov: cluster '{name}' is busy: `gpuprov provision {name}` "
                        rf"\(pid {first.proc.pid}\) has held it since {SINCE}\n", second.stderr), second.stderr
    _converged(subprocess.CompletedProcess([], code, out, err), nodes)
    assert all(s["changed"] == 0 for s in json.loads(out)["hosts"].values()), out


def _playbooks_under(pid: int) -> list[int]:
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    return [int(c) for c in children if b"ansible-playbook" in _cmdline(int(c))]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_provision_killed_mid_run_leaves_state_readable_and_the_next_converges(cluster, env) -> None:
    """`kill -9` of `provision` while the driver role runs on the nodes (nothing of gpuprov's
    runs after it): its playbook does not outlive it, the state stays readable (the run is
    recorded, and closed as failed once its process is gone), and the next `provision` converges with dpkg's database clean on
    every node and every GPU package held as before."""
    name, _, _ = cluster
    nodes = _node_names(env, name)
    held = _held(nodes)
    locked = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert all(set(locked["packages"]["driver"]) <= set(h) for h in held.values()), held
    killed = _Running("provision", name, "--tags", "driver", "-o", "json", env=env)
    try:
        killed.wait_for_role(nodes, "nvidia_driver")
        playbooks = _playbooks_under(killed.proc.pid)
        assert playbooks, "\n".join(killed.lines)
        killed.proc.kill()
    finally:
        code, _, err = killed.finish()
    assert code == -signal.SIGKILL, err
    deadline = time.monotonic() + 60
    while any(_cmdline(p) for p in playbooks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in playbooks if _cmdline(p)], "the killed run's ansible-playbook still runs"

    status = run_cli("status", name, "-o", "json", env=env)
    assert status.returncode == 0, status.stderr
    recorded = json.loads(status.stdout)
    assert [n["name"] for n in recorded["nodes"]] == nodes
    last = recorded["runs"][0]
    # Nothing will finish the killed run: it reads as finished, failed (its process is gone).
    assert (last["kind"], last["ok"]) == ("provision", False) and last["finished"], last

    _converged(run_cli("provision", name, "--tags", "driver", "-o", "json", env=env), nodes)
    for node in nodes:
        assert node_sh(node, "dpkg --audit; echo rc=$?") == "rc=0\n", node
    assert _held(nodes) == held


def test_a_node_stopped_mid_play_is_named_once_and_converges_when_back(cluster, env) -> None:
    """`docker stop` of a node while the driver role runs on it: the run goes on for the other
    node, names the lost one on one line, exits 1 without a traceback; once the node is started
    again, the next `provision` converges and `verify` finds it as its peer that was never
    stopped: the driver's probes pass on both, and every other probe comes out the same on both
    (the plays left out fail theirs, on both nodes alike: compared, not ignored)."""
    name, _, _ = cluster
    nodes = _node_names(env, name)
    served, lost = nodes
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={lost}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    run = _Running("provision", name, "--tags", "driver", "-o", "json", env=env)
    try:
        run.wait_for_role([lost], "nvidia_driver")
        subprocess.run(["docker", "stop", cid], capture_output=True, check=True)
    finally:
        code, out, err = run.finish()
        subprocess.run(["docker", "start", cid], capture_output=True, check=True)
    assert code == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    told = [line for line in err.splitlines() if line.startswith(f"  {lost}: ")
            and line.split(": ", 1)[1].startswith(("UNREACHABLE ", "FAILED "))]
    assert len(told) == 1, err
    result = json.loads(out)
    assert result["ok"] is False and list(result["errors"]) == [lost], result
    assert result["hosts"][served]["failed"] == 0 and result["hosts"][served]["unreachable"] == 0

    deadline = time.monotonic() + 120  # the node boots again: until it answers SSH
    while run_cli("exec", name, "--", "true", env=env).returncode != 0 and time.monotonic() < deadline:
        time.sleep(1)
    _converged(run_cli("provision", name, "--tags", "driver", "-o", "json", env=env), nodes)
    proc = run_cli("verify", name, "-o", "json", env=env)
    rows = {h: {p["probe"]: p["status"] for p in ps} for h, ps in json.loads(proc.stdout)["hosts"].items()}
    assert set(rows) == set(nodes), proc.stderr[-3000:]
    for node in nodes:
        driver = {p: rows[node].get(p) for p in DRIVER_PROBES}
        assert driver == dict.fromkeys(DRIVER_PROBES, "pass"), (node, driver, proc.stdout[-3000:])
    assert rows[lost] == rows[served], proc.stdout[-3000:]


