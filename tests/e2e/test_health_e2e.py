"""`gpuprov health` end to end on two local nodes, through the real CLI: real containers,
real SSH with the pinned host keys, the real gather script on each node. A container node
has no GPU, no kernel log of its own and no EFA: those checks skip, each with its reason;
what a container can be checked for (its GPU count against the catalog, memlock) is
checked for real and its verdict compared with what the node says itself."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli, unbootstrapped_cluster

pytestmark = pytest.mark.e2e

SKIP_ON_A_CONTAINER = {"gpu_answers", "driver", "fabricmanager", "nvlink", "ecc", "row_remap", "xid", "clocks",
                       "temperature", "efa", "peermem"}


@pytest.fixture(scope="module")
def cluster(env):
    with unbootstrapped_cluster(env, "health") as made:
        yield made


def test_health_checks_each_node_over_ssh_and_skips_what_a_container_cannot_have(env, cluster) -> None:
    name, nodes = cluster
    proc = run_cli("health", name, "-o", "json", env=env, timeout=180)
    data = json.loads(proc.stdout)
    assert proc.returncode == (1 if data["summary"]["fail"] else 0), proc.stderr
    assert data["cluster"] == name and data["level"] == "quick"
    by_node = {n: {r["check"]: r for r in data["checks"] if r["node"] == n} for n in nodes}
    memlock_here = _memlock_on_nodes(env, name)
    for node, rows in by_node.items():
        assert len(rows) == 13, rows
        for check in SKIP_ON_A_CONTAINER:
            assert rows[check]["status"] == "skip" and rows[check]["reason"], rows[check]
        assert "container node" in rows["xid"]["reason"]
        assert rows["gpu_answers"]["reason"] == "container node: docker-node has no GPU (catalog: 0 GPUs)"
        # What runs, runs for real: the node's PCI bus holds no GPU, as the catalog says.
        assert rows["gpu_count"] == {**rows["gpu_count"], "status": "pass",
                                     "found": "0 NVIDIA GPU(s) on the PCI bus"}
        memlock = rows["memlock"]
        if memlock["status"] != "skip":
            assert (memlock["status"] == "pass") == (memlock_here[node] == ["unlimited", "unlimited"]), memlock
            if memlock["status"] == "fail":
                assert f"gpuprov provision {name} --tags rdma" in memlock["action"]
        assert {r["status"] for r in rows.values()} <= {"pass", "fail", "skip"}
    for node in nodes:
        assert re.search(rf"{node}: \d+ pass, \d+ fail, \d+ skip", proc.stderr)


def test_the_standard_level_runs_its_tools_section_on_each_node_and_skips_them_without_gpu(env, cluster) -> None:
    """--level standard over SSH: the quick level's 13 checks and DCGM's diagnostic and NCCL
    inside the node, whose sections the script ran on each node (guarded: no NVIDIA device on
    a container's PCI bus, so neither tool was started) and whose checks skip saying why."""
    name, nodes = cluster
    proc = run_cli("health", name, "--level", "standard", "-o", "json", env=env, timeout=300)
    data = json.loads(proc.stdout)
    assert data["level"] == "standard" and proc.returncode == (1 if data["summary"]["fail"] else 0), proc.stderr
    runs = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    raw_dir = Path(next(r for r in runs if r["kind"] == "health")["artifact_dir"])
    for node in nodes:
        rows = {r["check"]: r for r in data["checks"] if r["node"] == node}
        assert len(rows) == 15, rows
        for check in ("dcgm_diag", "nccl_allreduce_node"):
            assert rows[check]["status"] == "skip", rows[check]
            assert rows[check]["reason"] == "container node: docker-node has no GPU (catalog: 0 GPUs)"
        raw = (raw_dir / f"{node}.txt").read_text()
        assert "@@gpuprov-health dcgm_diag\nno NVIDIA device on the PCI bus\n@@gpuprov-health-rc dcgm_diag 0" in raw
        assert "@@gpuprov-health nccl_tests\nno NVIDIA device on the PCI bus\n" in raw


def test_the_full_level_runs_on_local_nodes_and_mpirun_crosses_them_with_a_key_of_its_own(env, cluster) -> None:
    """--level full over SSH: DCGM's level 3 section guarded like level 2's, each node's own
    address read, the row across the nodes skipping because no node has a GPU. Then the
    run-across machinery itself, for real: Open MPI (Debian's) on both nodes, mpirun started on
    the first and reaching the second with a key made for the run, checked against the host key
    gpuprov pinned for it; afterwards no key, no key line and no run directory is left."""
    from gpuprov.health import cluster_nccl, gather
    from gpuprov.health.facts import Facts
    from gpuprov.providers import ClusterFiles

    name, nodes = cluster
    proc = run_cli("health", name, "--level", "full", "-o", "json", env=env, timeout=300)
    data = json.loads(proc.stdout)
    assert data["level"] == "full", proc.stderr
    across = [r for r in data["checks"] if r["node"] == "cluster"]
    assert [(r["check"], r["status"], r["reason"]) for r in across] == [
        ("nccl_allreduce_cluster", "skip", f"{nodes[0]}: no NVIDIA GPU on the PCI bus")]
    runs = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    raw_dir = Path(next(r for r in runs if r["kind"] == "health")["artifact_dir"])
    facts = {n: Facts(gather.split((raw_dir / f"{n}.txt").read_text())) for n in nodes}
    for node in nodes:
        assert len([r for r in data["checks"] if r["node"] == node]) == 15
        assert "@@gpuprov-health dcgm_diag\nno NVIDIA device on the PCI bus\n" in (raw_dir / f"{node}.txt").read_text()
        assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", facts[node].text("cluster_address").strip())

    install = run_cli("exec", name, "--", "sudo", "-n", "sh", "-c",
                      "DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                      "apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null && command -v mpirun",
                      env=env, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    from gpuprov.state import Store

    store = Store(Path(env["GPUPROV_HOME"]) / "state.db")
    records = {n.name: n for n in store.get_cluster(name).nodes}
    files = ClusterFiles(Path(env["GPUPROV_HOME"]) / "clusters" / name)
    group = [cluster_nccl.Peer(records[n], facts[n].text("cluster_address").strip(), 1) for n in nodes]
    ran = cluster_nccl.mpi_run(group, files, ["hostname"], ranks_per_node=1, timeout=120)
    hostnames = run_cli("exec", name, "--", "hostname", env=env, check=True).stdout
    assert ran.rc == 0 and ran.left == (), ran
    for line in hostnames.splitlines():
        assert line.partition(" | ")[2].strip() in ran.output.split(), (hostnames, ran.output)
    left = run_cli("exec", name, "--", "sh", "-c",
                   "grep -c gpuprov-mpi- ~/.ssh/authorized_keys; ls -d /dev/shm/gpuprov-mpi-* 2>/dev/null; true",
                   env=env, check=True).stdout
    assert [line.partition(" | ")[2].strip() for line in left.splitlines()] == ["0", "0"], left


# -- the run's key under faults: nothing left behind, no one else's line touched (these need the
# Open MPI the test above installed on both nodes) -----------------------------------------------
# Lines of other people's: an operator's key, an expired line of an earlier run (its comment the
# run's id alone: the one kind of line a run removes besides its own), a live line of another run.
OPERATOR = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorsOwnKeyNotReal0000000000000 operator@desk"
STALE = (b'expiry-time="202001010000Z",from="10.0.0.9",restrict ssh-ed25519 '
         b"AAAAC3NzaC1lZDI1NTE5AAAAIStaleRunKeyNotReal000000000000000 gpuprov-mpi-00000000000b")
LIVE = (b'expiry-time="209901010000Z",from="10.0.0.9",restrict ssh-ed25519 '
        b"AAAAC3NzaC1lZDI1NTE5AAAAILiveRunKeyNotReal0000000000000000 gpuprov-mpi-00000000000c")
LAST = b"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQLastLineNotReal operator@laptop"


def _container(node: str) -> str:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert cid, f"no container for {node}"
    return cid


def _on(node: str, command: str, *, user: str = "gpuprov", data: bytes | None = None) -> bytes:
    """``command`` on ``node`` as ``user``, through docker (the test's own hands, not gpuprov's)."""
    proc = subprocess.run(["docker", "exec", "-i", "-u", user, _container(node), "sh", "-c", command],
                          input=data or b"", capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    return proc.stdout


def _keys(node: str) -> bytes:
    return _on(node, "cat ~/.ssh/authorized_keys")


def _run_lines(node: str) -> list[bytes]:
    return [line for line in _keys(node).splitlines() if b"gpuprov-mpi-" in line]


def _group(env, name: str, nodes: list[str]) -> tuple[list, object]:
    """The run's nodes as cluster_nccl takes them (one rank each), at the addresses the
    full level's own command reads on each node, and the cluster's files."""
    from gpuprov.health import cluster_nccl, gather
    from gpuprov.providers import ClusterFiles
    from gpuprov.state import Store

    records = {n.name: n for n in Store(Path(env["GPUPROV_HOME"]) / "state.db").get_cluster(name).nodes}
    files = ClusterFiles(Path(env["GPUPROV_HOME"]) / "clusters" / name)
    return [cluster_nccl.Peer(records[n], _on(n, gather.FULL["cluster_address"]).decode().strip(), 1)
            for n in nodes], files


@pytest.fixture
def keys_kept(cluster):
    """Each node's authorized_keys as it was, put back after the test whatever happened."""
    _, nodes = cluster
    kept = {n: _keys(n) for n in nodes}
    yield kept
    for node, data in kept.items():
        _on(node, 'cat > ~/.ssh/authorized_keys; rm -rf /dev/shm/gpuprov-mpi-*', data=data)


def test_a_key_file_without_a_final_newline_loses_no_line_and_expired_run_lines_go(env, cluster, keys_kept) -> None:
    """The peer's authorized_keys ends without a newline: the run's line goes on a line of its
    own (mpirun logs in with it), and afterwards every line is byte for byte as it was but the
    expired line of an earlier run; the other run's live line stays."""
    from gpuprov.health import cluster_nccl

    name, nodes = cluster
    launcher, peer = nodes
    before = keys_kept[peer] + b"\n".join([OPERATOR, STALE, LIVE, LAST])  # no final newline
    _on(peer, "cat > ~/.ssh/authorized_keys", data=before)
    group, files = _group(env, name, nodes)
    ran = cluster_nccl.mpi_run(group, files, ["hostname"], ranks_per_node=1, timeout=120)
    assert ran.rc == 0 and ran.left == () and set(nodes) <= set(ran.output.split()), ran
    assert _keys(peer) == keys_kept[peer] + b"\n".join([OPERATOR, LIVE, LAST]) + b"\n"
    assert _keys(launcher) == keys_kept[launcher]


def test_a_cleanup_that_times_out_on_one_node_still_cleans_the_others(env, cluster, keys_kept, monkeypatch) -> None:
    """The launcher stops answering once logged in (as a node whose home hangs: its rank puts a
    long sleep first in the login's ~/.bashrc, which Debian's bash reads for an SSH command):
    its cleanup runs past its time and is named with why; the peer's is done all the same,
    its file byte for byte as before (the old loop ended at the launcher's timeout, leaving
    the peer's key)."""
    from gpuprov.health import cluster_nccl, mpi_key

    name, nodes = cluster
    launcher, peer = nodes
    monkeypatch.setattr(mpi_key, "CLEANUP_TIMEOUT_S", 8)
    group, files = _group(env, name, nodes)
    bashrc = _on(launcher, "cat ~/.bashrc")
    hang = (f'if [ "$(hostname)" = {launcher} ]; then {{ echo "sleep 599"; cat ~/.bashrc; }} > ~/.bashrc.new && '
            "mv ~/.bashrc.new ~/.bashrc; fi; hostname")
    try:
        ran = cluster_nccl.mpi_run(group, files, ["sh", "-c", hang], ranks_per_node=1, timeout=120)
    finally:
        _on(launcher, "cat > ~/.bashrc", data=bashrc)
        _on(launcher, "pkill -f '^sleep 599$'; true", user="root")
    assert ran.rc == 0 and ran.left == (f"{launcher}: no answer within 8 s",), ran
    assert _keys(peer) == keys_kept[peer] and not _run_lines(peer)
    # What the launcher's cleanup could not do, left as it was: the run's directory (its
    # private key, whose public half no node has any more).
    assert _on(launcher, f"ls /dev/shm/{ran.run_id}").split() == [b"hostfile", b"id", b"known_hosts"]


# FIXTURE: a container node has no GPU, so the full level would skip its run across nodes; this
# CLI sees one GPU on each node's bus, and each node's all_reduce_perf (nccl-tests needs a GPU) is
# a script that says it started and waits. Everything else is gpuprov's command line as it runs.
FIXTURE_CLI = """
import sys
from gpuprov.health import facts
facts.Facts.gpus_on_bus = property(lambda self: 1)
from gpuprov.cli.app import main
main(sys.argv[1:])
"""
FIXTURE_ALL_REDUCE = b"""#!/bin/sh
# FIXTURE (gpuprov's test suite): nccl-tests' all_reduce_perf stands in; it says it started and waits.
touch /dev/shm/fixture-all-reduce-started
while :; do sleep 1; done
"""


def test_sigterm_during_the_run_cleans_up_then_exits_as_interrupted(env, cluster, keys_kept) -> None:
    """`gpuprov health --level full` as a process, sent SIGTERM while mpirun runs (the key on
    the peer): the key is taken away from every node, the launcher's directory removed, the
    run's ranks stopped; gpuprov says so on one line and exits 143."""
    import signal
    import sys

    name, nodes = cluster
    launcher, peer = nodes
    before = keys_kept[peer] + OPERATOR + b"\n"
    _on(peer, "cat > ~/.ssh/authorized_keys", data=before)
    for node in nodes:
        _on(node, "cat > /usr/local/bin/all_reduce_perf && chmod 755 /usr/local/bin/all_reduce_perf && "
                  "rm -f /dev/shm/fixture-all-reduce-started", user="root", data=FIXTURE_ALL_REDUCE)
    proc = subprocess.Popen([sys.executable, "-c", FIXTURE_CLI, "health", name, "--level", "full", "-o", "json"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while b"yes" not in _on(peer, "[ -e /dev/shm/fixture-all-reduce-started ] && echo yes; true"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
            time.sleep(0.5)
        assert len(_run_lines(peer)) == 1  # the run's key is out
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 143, err
        assert err.decode().strip().splitlines()[-1] == ("gpuprov: interrupted (SIGTERM) during the run across "
                                                         "nodes; the run's key is removed from every node"), err
        assert _keys(peer) == before and _keys(launcher) == keys_kept[launcher]
        assert _on(launcher, "ls -d /dev/shm/gpuprov-mpi-* 2>/dev/null; true") == b""
        deadline = time.monotonic() + 60  # mpirun, sent SIGTERM by the cleanup, stops its ranks
        while any(_on(n, "pgrep -f '[/]usr/local/bin/all_reduce_perf'; true") for n in nodes):
            assert time.monotonic() < deadline, "the run's ranks are still running"
            time.sleep(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for node in nodes:  # (the pattern in brackets: pkill's own shell does not match it)
            _on(node, "pkill -f '[/]usr/local/bin/all_reduce_perf'; true", user="root")
            _on(node, "rm -f /usr/local/bin/all_reduce_perf /dev/shm/fixture-all-reduce-started", user="root")


FULL_FS = """set -e
m=/mnt/gpuprov-full-fs
mkdir -p $m && mount -t tmpfs -o size=64k,mode=0755 gpuprov-full-fs $m
mkdir $m/ssh $m/tmp && chmod 1777 $m/tmp && cp -a /home/gpuprov/.ssh/. $m/ssh/
chown gpuprov:gpuprov $m/ssh && chmod 700 $m/ssh
mount --bind $m/ssh /home/gpuprov/.ssh && mount --bind $m/tmp /tmp
runuser -u gpuprov -- dd if=/dev/zero of=/tmp/gpuprov-fill bs=4k 2>/dev/null || true
"""
UNDO_FULL_FS = ("umount /tmp; umount /home/gpuprov/.ssh; umount /mnt/gpuprov-full-fs; "
                "rmdir /mnt/gpuprov-full-fs; true")


def test_a_full_disk_at_cleanup_leaves_the_key_file_whole_and_says_so(env, cluster, keys_kept) -> None:
    """The peer's disk is full (its ~/.ssh and /tmp on one small file system, filled: the key's
    line still fits the file's last block, nothing more fits): the cleanup cannot write the new
    file and leaves the old one byte for byte (the old cleanup emptied it), naming the node
    and why; once there is room, the same cleanup removes the line."""
    from gpuprov.health import cluster_nccl, mpi_key

    name, nodes = cluster
    _, peer = nodes
    group, files = _group(env, name, nodes)
    _on(peer, FULL_FS, user="root")
    try:
        before = _keys(peer)
        ran = cluster_nccl.mpi_run(group, files, ["true"], ranks_per_node=1, timeout=120)
        assert len(ran.left) == 1 and ran.left[0].startswith(
            f"{peer}: could not write the new /home/gpuprov/.ssh/authorized_keys (grep: write error: No space "
            "left on device"), ran
        after = _keys(peer)
        assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1, after
        line = after[len(before):].rstrip(b"\n").decode()
        assert line.split()[-1] == ran.run_id
        assert line.startswith(f'expiry-time="{ran.expires}",from="{group[0].address}",restrict ssh-ed25519 ')

        _on(peer, "rm /tmp/gpuprov-fill")
        remove = cluster_nccl._ssh(group[1].node, files, mpi_key.remote("remove", ran.run_id))
        assert mpi_key.remove_everywhere([(peer, remove)], line) == []
        assert _keys(peer) == before
    finally:
        _on(peer, UNDO_FULL_FS, user="root")
    assert _keys(peer) == keys_kept[peer]


def test_the_run_is_recorded_with_the_raw_readings_and_status_shows_it(env, cluster) -> None:
    name, nodes = cluster
    proc = run_cli("health", name, "--node", nodes[1], "-o", "json", env=env, timeout=120)
    data = json.loads(proc.stdout)
    assert {r["node"] for r in data["checks"]} == {nodes[1]}
    status = run_cli("status", name, env=env, check=True)
    verdict = "ok" if data["ok"] else "FAILED"
    assert re.search(rf"health \(quick, [^)]+\): {verdict}, {data['summary']['pass']} pass", status.stdout)
    runs = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    health = next(r for r in runs if r["kind"] == "health")
    raw = Path(health["artifact_dir"]) / f"{nodes[1]}.txt"
    assert "@@gpuprov-health pci" in raw.read_text()


def test_an_unknown_node_is_one_line_and_exit_2(env, cluster) -> None:
    name, _ = cluster
    proc = run_cli("health", name, "--node", "nosuch", env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--node nosuch: not a node of" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_up_checks_health_before_it_reports_the_cluster_ready(env, cluster) -> None:
    """`up` on a cluster whose bootstrap is done (recorded as a finished bootstrap leaves it:
    a full bootstrap takes minutes, and `up` resumes nothing once it has run) runs the quick
    level on every node over SSH, prints it in its JSON and records it; a failing check is
    exit 1 with its node, check and action; `--health off` runs none. (`--no-verify`: these nodes
    were never bootstrapped, their probes would fail; the probes `up` runs are the e2e units of a
    bootstrapped cluster's: test_docker_cluster.py, test_baked_cluster.py.)"""
    from gpuprov.state import Store

    name, nodes = cluster
    store = Store(Path(env["GPUPROV_HOME"]) / "state.db")
    store.set_cluster_state(name, "bootstrapped")
    began = time.monotonic()
    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--health", "quick", "--no-verify",
                   "-o", "json", env=env, timeout=300)
    print(f"\nFIGURE up --health quick, 2 bootstrapped nodes: {time.monotonic() - began:.1f} s")
    data = json.loads(proc.stdout)
    assert data["bootstrap"]["resumed_from"] == "bootstrapped", proc.stderr
    health = data["health"]
    assert health["cluster"] == name and health["level"] == "quick"
    assert sorted({r["node"] for r in health["checks"]}) == nodes and len(health["checks"]) == 26
    failing = [r for r in health["checks"] if r["status"] == "fail"]
    assert proc.returncode == (1 if failing else 0) and health["ok"] is not failing, proc.stderr
    for r in failing:
        assert f"{name}: not ready: {r['node']}: health {r['check']}: {r['found']} -> {r['action']}" in proc.stderr
    assert data["verdict"]["ready"] is (False if failing else None), data["verdict"]  # None: --no-verify
    runs = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    assert runs[0]["kind"] == "health" and runs[0]["ok"] is health["ok"]

    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--health", "off", "--no-verify",
                   "-o", "json", env=env, timeout=300)
    assert proc.returncode == 0 and "health" not in json.loads(proc.stdout), proc.stderr
    again = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    assert [r["id"] for r in again if r["kind"] == "health"] == [r["id"] for r in runs if r["kind"] == "health"]


def _memlock_on_nodes(env, name: str) -> dict[str, list[str]]:
    """What each node says itself (gpuprov exec, the same SSH), for memlock in a user session."""
    proc = run_cli("exec", name, "--", "sudo", "-n", "runuser", "-u", "nobody", "--", "sh", "-c",
                   "ulimit -l; ulimit -Hl", env=env)
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        node, _, value = line.partition(" | ")
        out.setdefault(node.strip(), []).append(value.strip())
    return out
