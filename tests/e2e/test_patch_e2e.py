"""`gpuprov patch` end to end on three local nodes, through the real CLI: real
containers, real SSH, real Ansible, real apt moving real (FIXTURE-payload)
packages from the signed fixture repository (tests/fixtures/patchrepo.py).

The nodes start as a fleet the previous gpuprov release built: driver 535.288.01
(its pin), converged with playbooks/driver.yml only (no 2.7 GB installs). The
tests run in file order: --check changes nothing; a roll stopped by a broken
node (first node patched, failing node reported, third untouched); the roll
completed; a no-op patch; the kernel guard refusing a node whose next kernel
has no NVIDIA module. Between the last two: the branch and flavour move to R580 open.

The fleet runs Slurm (`provision --scheduler slurm --tags slurm`): every roll drains its nodes
through Slurm and resumes them; a job running on a node is waited for (the failing-node roll),
one still running past `--grace` keeps its node drained and unpatched, and `--force` patches
without waiting (the branch move).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.fixtures import patchrepo

pytestmark = pytest.mark.e2e

OLD, NEW, R580 = patchrepo.DRIVERS
PACKAGES = "nvidia-driver-535 nvidia-dkms-535 linux-headers-amd64"


@pytest.fixture(scope="module")
def repo():
    from gpuprov.providers.docker import bridge_gateway

    r = patchrepo.start(bridge_gateway())
    yield r
    r.close()


def old_lock() -> dict:
    """The lock the previous gpuprov release pinned: driver 535.288.01 from a mirror."""
    from gpuprov.lock import stack

    lock = stack.resolve(None, source="mirror", driver="535", kernel_module="proprietary").as_dict()
    lock.update(driver=OLD, packages={**lock["packages"], "driver_version": f"{OLD}-*"})
    lock.pop("microcode")  # stored before the microcode pins existed
    lock["hash"] = stack.from_dict({k: v for k, v in lock.items() if k != "hash"}).short_hash()
    return lock


@pytest.fixture(scope="module")
def fleet(env, repo, tmp_path_factory):
    from gpuprov.state import Store

    name = f"patch-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "3", "--name", name, "--no-bootstrap",
            "--source", "mirror", "--mirror-url", repo.url,
            "--mirror-key-fingerprint", repo.fingerprint, env=env, check=True)
    try:
        run_cli("inventory", name, env=env, check=True)  # renders the inventory, pins host keys
        cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
        lock = old_lock()
        Store(Path(env["GPUPROV_HOME"]) / "state.db").set_lock(name, lock)
        extra = tmp_path_factory.mktemp("vars") / "vars.json"
        extra.write_text(json.dumps({"gpuprov_stack": lock, "gpuprov_mirror_url": repo.url,
                                     "gpuprov_mirror_key_fingerprint": repo.fingerprint}))
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(cdir / "inventory.yml"),
             "-e", f"@{extra}", str(ROOT / "playbooks" / "driver.yml")],
            capture_output=True, text=True, check=False,
            env={**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg")})
        assert proc.returncode == 0, proc.stdout[-4000:]
        # driver.yml refreshed the fixture repository's lists only (the node image ships none):
        # the slurm role finds Debian's lists lacking its packages and refreshes them itself.
        # Accounting on the third node (--slurm-dbd, issue 59): its database is rolled over like
        # any node, and the last test reads it (tests/e2e/test_slurm_e2e.py proves accounting on
        # the controller, the default).
        proc = run_cli("provision", name, "--scheduler", "slurm", "--slurm-dbd", f"{name}-node-3", "--tags", "slurm",
                       env=env, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        yield name, [f"{name}-node-{i}" for i in (1, 2, 3)]
    finally:
        run_cli("down", name, "--yes", env=env)


def sh(node: str, cmd: str) -> str:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return subprocess.run(["docker", "exec", cid, "sh", "-c", cmd], capture_output=True, text=True,
                          check=False).stdout


def state(node: str) -> str:
    """The node's package state: every installed package with its version, and the holds."""
    return sh(node, "dpkg-query -W -f='${Package} ${Version} ${Status}\\n'; apt-mark showhold")


def slurm_state(node: str, on: str) -> tuple[str, str]:
    """(state, reason) of ``node`` as the controller ``on`` shows it, once the controller hears
    from the node (sinfo's ``*``: not responding, seen for a few seconds on this loaded machine
    while the node's play ran; 60 s at most)."""
    deadline = time.monotonic() + 60
    while True:
        line = sh(on, f"sinfo --noheader --Node --nodes={node} --format='%T|%E'").strip().splitlines()[0]
        state, _, reason = line.partition("|")
        if not state.endswith("*") or time.monotonic() > deadline:
            return state, "" if reason == "none" else reason
        time.sleep(2)


def job(node: str, script: str) -> str:
    """A batch job of the nodes' user running ``script`` on ``node``, once it runs: its id."""
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    jid = subprocess.run(["docker", "exec", "-u", "gpuprov", "-w", "/tmp", cid, "sbatch", "--parsable",
                          "-w", node, "-o", "/dev/null", "--wrap", script],
                         capture_output=True, text=True, check=True).stdout.strip()
    deadline = time.monotonic() + 60
    while sh(node, f"squeue --noheader --jobs={jid} --format=%T").strip() != "RUNNING":
        assert time.monotonic() < deadline, sh(node, f"scontrol show job {jid}")
        time.sleep(1)
    return jid


# A job that runs until its node is drained, then 5 s more, and leaves a mark that it ran to its
# end (slurmctld forgets a finished job after MinJobAge, 300 s: longer than a loaded roll takes
# to reach its checks, so the mark, not `scontrol show job`, says it completed). A roll that does
# not wait for it patches under it (and then its "waited" note is missing).
UNTIL_DRAINED = ("timeout 900 sh -c 'until sinfo -h -N -n \"$(hostname -s)\" -o %T | grep -q drain; "
                 "do sleep 1; done; sleep 5; echo completed > /tmp/gpuprov-job-$SLURM_JOB_ID.end'")


def driver(node: str) -> str:
    return sh(node, "dpkg-query -W -f='${Version}' nvidia-driver-535")


def patch(env, repo, name, *args) -> tuple[subprocess.CompletedProcess[str], dict, float]:
    start = time.monotonic()
    proc = run_cli("patch", name, "--mirror-url", repo.url, "--mirror-key-fingerprint", repo.fingerprint,
                   *args, "-o", "json", env=env, timeout=900)
    took = time.monotonic() - start
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from patch (exit {proc.returncode}):\n{proc.stderr[-4000:]}") from None
    return proc, data, took


def runs(env, name):
    from gpuprov.state import Store

    return Store(Path(env["GPUPROV_HOME"]) / "state.db").runs(name)


def test_check_prints_the_plan_and_changes_nothing(env, repo, fleet):
    name, nodes = fleet
    before = {n: state(n) for n in nodes}
    proc, data, took = patch(env, repo, name, "--driver", "535", "--check")
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"\nFIGURE patch --check, 3 nodes: {took:.1f} s")
    assert data["ok"] and data["cluster"] == name
    for n in nodes:
        host = data["hosts"][n]
        assert host["status"] == "not-started" and host["rebooted"] is False
        assert f"nvidia-driver-535 {OLD}-1 -> {NEW}-*" in host["plan"], host
    assert {n: state(n) for n in nodes} == before
    assert runs(env, name)[0].kind == "patch-check"


def test_a_failing_node_stops_the_roll(env, repo, fleet, tmp_path):
    name, nodes = fleet
    first, broken, third = nodes
    # The broken node's package source: apt reaches the fixture repository only
    # through a proxy that does not answer.
    host = repo.url.split("/")[2].split(":")[0]
    sh(broken, f"echo 'Acquire::http::Proxy::{host} \"http://127.0.0.1:9\";' > /etc/apt/apt.conf.d/99broken;"
               " rm -rf /var/lib/apt/lists/*")
    third_before = state(third)
    log = tmp_path / "hooks.log"
    running = job(first, UNTIL_DRAINED)  # the roll drains the first node through Slurm and waits for it
    proc, data, _ = patch(env, repo, name, "--driver", "535", "--batch", "1",
                          "--drain", f"echo drain $GPUPROV_NODE >> {log}",
                          "--resume", f"echo resume $GPUPROV_NODE >> {log}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert not data["ok"]
    assert data["batches"] == [[first], [broken], [third]]
    assert data["hosts"][first]["status"] == "patched" and data["hosts"][first]["changed"] > 0
    assert data["hosts"][broken]["status"] == "failed" and data["hosts"][broken]["error"]
    assert data["hosts"][third]["status"] == "not-started"
    assert driver(first) == f"{NEW}-1" and driver(broken) == f"{OLD}-1"
    assert state(third) == third_before
    assert {"nvidia-driver-535", "nvidia-dkms-535"} <= set(sh(first, "apt-mark showhold").split())
    assert log.read_text().split("\n")[:-1] == [f"drain {first}", f"resume {first}", f"drain {broken}"]
    # Through Slurm: the job was waited for (it ran to its end), the first node resumed, the
    # failing node left drained with why, the third never touched.
    assert sh(first, f"cat /tmp/gpuprov-job-{running}.end").strip() == "completed"
    assert data["hosts"][first]["slurm"] == "drained; waited for its jobs to end; resumed", data["hosts"][first]
    assert data["hosts"][broken]["slurm"] == "drained; left drained"
    assert "slurm" not in data["hosts"][third]
    assert slurm_state(first, first) == ("idle", "")
    state_, reason = slurm_state(broken, first)
    assert state_ == "drained" and reason.startswith("gpuprov patch failed: "), (state_, reason)
    assert slurm_state(third, first) == ("idle", "")
    # Container nodes cannot reboot: said so, not silently skipped.
    assert "container" in data["hosts"][first].get("reboot_skipped", "") or not data["hosts"][first]["rebooted"]
    record = runs(env, name)[0]
    assert record.kind == "patch" and record.ok is False
    assert record.summary["hosts"][broken]["status"] == "failed"
    assert json.loads(run_cli("status", name, "-o", "json", env=env).stdout)["stack"]["driver"] == OLD


def test_the_roll_completes_once_the_node_is_fixed(env, repo, fleet):
    name, nodes = fleet
    first, broken, third = nodes
    sh(broken, "rm /etc/apt/apt.conf.d/99broken")
    proc, data, _ = patch(env, repo, name, "--driver", "535", "--batch", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert data["ok"] and data["batches"] == [[broken, third]]
    assert data["hosts"][first]["status"] == "unchanged"
    assert data["hosts"][broken]["status"] == data["hosts"][third]["status"] == "patched"
    assert all(driver(n) == f"{NEW}-1" for n in nodes)
    # The node the last roll left drained is resumed by this one.
    assert data["hosts"][broken]["slurm"] == "drained; resumed"
    # Its baseline probes found it drained (by the last roll, not this one): reported at once,
    # with the Reason, instead of waiting out sinfo's and srun's timeouts.
    before = sorted((Path(env["GPUPROV_HOME"]) / "clusters" / name / "runs").glob("*-patch/probes-before"))[-1]
    rows = {r["probe"]: r for r in map(json.loads, (before / "probes.jsonl").read_text().splitlines())
            if r["host"] == broken}
    assert rows["srun_runs_a_task_on_this_node"]["status"] == "fail", rows
    assert "no job can run there" in rows["srun_runs_a_task_on_this_node"]["detail"]
    assert "gpuprov patch failed" in rows["node_takes_work_in_sinfo"]["detail"]
    assert {slurm_state(n, first) for n in nodes} == {("idle", "")}
    assert json.loads(run_cli("status", name, "-o", "json", env=env).stdout)["stack"]["driver"] == NEW


def test_a_noop_patch_changes_nothing(env, repo, fleet):
    name, nodes = fleet
    before = {n: state(n) for n in nodes}
    proc, data, took = patch(env, repo, name, "--driver", "535")
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"\nFIGURE no-op patch, 3 nodes: {took:.1f} s")
    assert data["ok"] and data["batches"] == []
    assert {h["status"] for h in data["hosts"].values()} == {"unchanged"}
    assert {n: state(n) for n in nodes} == before


def test_a_new_gpu_sharing_moves_into_slurms_configuration_on_every_node(env, repo, fleet):
    """Issue 58: `patch --gpu-sharing shard:2` on the Slurm fleet, one batch of the three nodes.
    Each is drained and patched (the gpu_sharing role's node program and units go on; these
    nodes have no GPU, so it has no instance to make), passes its probes and stays drained,
    held, while Slurm's configuration has the old sharing; the lock moves, the slurm play writes
    the new sharing into slurm.conf on every node (GresTypes=gpu,shard), Slurm takes it, and
    then every held node is resumed. (Until this test, a patch of the sharing alone stopped at
    node_patch's "something to move" assertion on every node.)"""
    name, nodes = fleet
    proc, data, _ = patch(env, repo, name, "--gpu-sharing", "shard:2", "--batch", "3")
    assert proc.returncode == 0 and data["ok"], proc.stderr[-3000:]
    assert data["batches"] == [nodes]
    for node in nodes:
        host = data["hosts"][node]
        assert host["status"] == "patched", host
        assert host["slurm"] == ("drained; held drained until Slurm has the new GPU sharing; "
                                 "resumed (Slurm has the new GPU sharing)"), host
    assert f"{nodes[0]}: patched - held drained until Slurm has the new GPU sharing" in proc.stderr
    said = proc.stderr.splitlines()
    slurm_step = said.index(f"{name}: Slurm: slurm.conf and gres.conf with the new GPU sharing on every node")
    assert slurm_step > max(i for i, line in enumerate(said) if "held drained until" in line)
    assert f"Slurm has the new GPU sharing; resumed: {', '.join(nodes)}" in proc.stderr
    for node in nodes:
        assert "GresTypes=gpu,shard" in sh(node, "cat /etc/slurm/slurm.conf").split(), node
    assert re.search(r"^GresTypes\s*=\s*gpu,shard$", sh(nodes[0], "scontrol show config"), re.M)
    assert json.loads(run_cli("status", name, "-o", "json", env=env).stdout)["stack"]["gpu_sharing"] == "shard:2"
    for node in nodes:
        assert slurm_state(node, nodes[0])[0] == "idle", node


@pytest.mark.extended(why=(
    "R535 proprietary -> R580 open by `patch` on the Slurm fleet, and a job past --grace, then --force "
    "(about 8 minutes of two cores); in `make test` the driver role makes the same package move "
    "(tests/roles/test_repo_trust.py), its plan is tests/unit/test_patch_unit.py's, and a roll that waits "
    "for a job is test_a_failing_node_stops_the_roll; --grace and --force on a real fleet are proven here only"))
def test_branch_and_flavour_move(env, repo, fleet):
    """`patch --driver 580 --kernel-module open`: the plan names what comes (NVIDIA's release pin,
    the open flavour's packages) and what goes (the R535 packages), then the roll does it; the
    lock records branch, release and flavour."""
    name, nodes = fleet
    before = {n: state(n) for n in nodes}
    # The R535 release each node has now: NEW after the rolls of the tests above, OLD where this
    # test runs alone (`make test-extended` selects it without them).
    have = {n: sh(n, "dpkg-query -W -f='${Version}' nvidia-driver-535").strip() for n in nodes}
    assert set(have.values()) <= {f"{OLD}-1", f"{NEW}-1"}, have
    proc, data, _ = patch(env, repo, name, "--driver", "580", "--kernel-module", "open", "--check")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for n in nodes:
        assert data["hosts"][n]["plan"] == [
            f"nvidia-driver-pinning-{R580} not installed -> installed",
            f"nvidia-driver-580-open not installed -> {R580}-*",
            f"nvidia-dkms-580-open not installed -> {R580}-*",
            f"nvidia-driver-535 {have[n]} -> removed",
            f"nvidia-dkms-535 {have[n]} -> removed",
            "reboot: none (container node: it shares the kernel of its host)"], data["hosts"][n]
    assert {n: state(n) for n in nodes} == before
    # A job still running on the third node after --grace: that node is neither patched nor
    # resumed, the others are; --force then patches it without waiting.
    first, third = nodes[0], nodes[2]
    running = job(third, "sleep 600")
    proc, data, _ = patch(env, repo, name, "--driver", "580", "--kernel-module", "open", "--batch", "3",
                          "--grace", "2")
    assert proc.returncode == 1 and not data["ok"], proc.stderr[-3000:]
    assert [data["hosts"][n]["status"] for n in nodes] == ["patched", "patched", "failed"], data["hosts"]
    assert f"1 job(s) still running on {third} after the 2 s grace time ({running})" in data["hosts"][third]["error"]
    assert state(third) == before[third]
    state_, reason = slurm_state(third, first)
    assert state_ == "draining" and reason.startswith("gpuprov patch failed: 1 job(s) still running"), (state_, reason)
    proc, data, _ = patch(env, repo, name, "--driver", "580", "--kernel-module", "open", "--batch", "3",
                          "--force")
    assert proc.returncode == 0 and data["ok"], proc.stderr[-3000:]
    assert [data["hosts"][n]["status"] for n in nodes] == ["unchanged", "unchanged", "patched"]
    assert data["hosts"][third]["slurm"] == f"drained; --force: not waiting for job(s) {running}; resumed"
    # (the job may or may not outlive a patch under it: --force says so; the node is back in work)
    assert "drain" not in slurm_state(third, first)[0]
    sh(first, f"scancel {running}")
    for n in nodes:
        assert sh(n, "dpkg-query -W -f='${db:Status-Abbrev}${Package}\\n' 'nvidia-*' | awk '/^.i/ { print $2 }'"
                  ).split() == ["nvidia-dkms-580-open", "nvidia-driver-580-open", f"nvidia-driver-pinning-{R580}"]
        assert {"nvidia-driver-580-open", "nvidia-dkms-580-open"} <= set(sh(n, "apt-mark showhold").split())
    lock = json.loads(run_cli("status", name, "-o", "json", env=env).stdout)["stack"]
    assert (lock["driver_branch"], lock["driver"], lock["kernel_module"]) == ("580", R580, "open")


def test_kernel_guard_refuses_a_next_kernel_without_module(env, repo, fleet):
    name, nodes = fleet
    node = nodes[2]
    sh(node, "apt-get install -y -q linux-headers-amd64=99.1 >/dev/null 2>&1")
    assert "99.1" in sh(node, "dpkg-query -W linux-headers-amd64")
    proc, data, _ = patch(env, repo, name, "--kernel")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert data["batches"] == [[node]]
    host = data["hosts"][node]
    assert host["status"] == "failed" and host["rebooted"] is False
    assert f"kernel guard: no NVIDIA module built for kernel {patchrepo.NEXT_KERNEL}" in host["error"]
    # Nothing to move on the other two, but the roll stopped: a node it never reached is
    # not-started, whatever the plan predicted (trust review finding 13).
    assert {data["hosts"][n]["status"] for n in nodes[:2]} == {"not-started"}


def test_accounting_on_its_own_node_keeps_the_rolls_jobs_and_is_exported_from_there(env, fleet, tmp_path):
    """Issue 59, `--slurm-dbd`: slurmdbd and MariaDB run on the fleet's third node alone; every
    node's slurm.conf sends accounting there; the jobs of the rolls above (drained, waited for,
    patched under, the third node itself rolled over) are in `sacct` on the controller; and `down
    --keep-accounting` dumps the database on the third node (sacct's lines from the controller)
    before it removes the cluster."""
    name, nodes = fleet
    first, third = nodes[0], nodes[2]
    assert sh(third, "systemctl is-active slurmdbd mariadb").split() == ["active", "active"]
    assert sh(first, "systemctl is-active slurmdbd mariadb").split() == ["inactive", "inactive"]
    assert sh(first, "test -e /etc/slurm/slurmdbd.conf && echo there || echo none").strip() == "none"
    address = sh(third, "ip -4 -o addr show dev eth0").split()[3].split("/")[0]
    for node in nodes:
        assert f"AccountingStorageHost={address}" in sh(node, "cat /etc/slurm/slurm.conf").split(), node
    # (root's are the health program's and the probes' own steps; the nodes' user's, the rolls' jobs)
    jobs = sh(first, "sacct -a -X -n -P -S 2020-01-01 --format=JobID,User,State").split()
    assert any(j.split("|")[1] == "gpuprov" for j in jobs), jobs
    proc = run_cli("down", name, "--keep-accounting", "--yes", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"exporting a mysqldump of slurm_acct_db from {third}" in proc.stderr
    assert f"exporting every job's sacct line from {first}" in proc.stderr
    kept = next((Path(env["GPUPROV_HOME"]) / "clusters" / name).glob("accounting-*"))
    assert "CREATE TABLE" in (kept / "slurm_acct_db.sql").read_text()
    assert len((kept / "sacct.txt").read_text().splitlines()) == len(jobs) + 1  # and its header

