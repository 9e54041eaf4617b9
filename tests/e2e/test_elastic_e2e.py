"""Elastic Slurm on local nodes, end to end through the real CLI (docs/slurm.md, "Elastic
clusters"): `up --scheduler slurm --count 1 --max-count 3 --idle-minutes 1` makes one static node
(the controller, from the plain node image; the rdma and slurm plays only) and declares two
dynamic ones, starts the cluster's power service on this machine and bakes the image the dynamic
nodes boot from out of the static node (this cluster had none for its lock). Then a job on two
nodes the static one is kept out of resumes both dynamic nodes through slurmctld's power program,
the service and Docker, runs on them, and after the idle time they are powered down and gone; a
resume that fails (the image removed: a fault made here) leaves the node DOWN with the reason in
Slurm, and the job pending until a node can come up; a dynamic node's container running while Slurm has the
node powered down (an orphan) is removed; `down` stops the service and leaves nothing.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, container

pytestmark = pytest.mark.e2e

# Slurm's names of the dynamic nodes of cluster NAME (gpuprov.slurm.elastic.dynamic_name).
DYNAMIC = ("dy-1", "dy-2")


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=120).stdout


def _service_pid(env: dict[str, str], name: str) -> int | None:
    try:
        pid = json.loads((Path(env["GPUPROV_HOME"]) / "clusters" / name / "power-service.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return pid if b"power-service" in argv and name.encode() in argv else None


@pytest.fixture(scope="module")
def cluster(env: dict[str, str]):
    name = f"ela-{secrets.token_hex(3)}"
    try:
        # The service started by `up` checks for orphans every 5 s here (60 by default), and enters
        # protected mode at the first failed resume (3 in a row by default).
        # No accounting (slurmdbd and MariaDB): dynamic nodes are what it proves (the suite's time;
        # tests/e2e/test_slurm_e2e.py proves accounting).
        proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--scheduler", "slurm",
                       "--max-count", "3", "--idle-minutes", "1", "--no-accounting", "--tags", "rdma,slurm",
                       "--health", "off", "--no-verify", "-o", "json",
                       env={**env, "GPUPROV_POWER_CHECK_S": "5", "GPUPROV_POWER_PROTECT_AFTER": "1"}, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        nodes = [n["name"] for n in json.loads(proc.stdout)["nodes"]]
        yield name, nodes[0], proc.stderr
    finally:
        pid = _service_pid(env, name)
        image = _image_of(env, name)
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)
        if image:  # `down` keeps a cluster's baked image for the next cluster of its lock: the test's own goes
            subprocess.run(["docker", "image", "rm", "-f", image], capture_output=True, check=False, timeout=120)
        assert pid is None or _service_pid(env, name) is None
        assert not (pid and Path(f"/proc/{pid}").exists() and b"power-service" in Path(
            f"/proc/{pid}/cmdline").read_bytes()), "down left the power service running"


def _image_of(env: dict[str, str], name: str) -> str | None:
    """The image the cluster's dynamic nodes boot from (baked by its `up`), as status says."""
    proc = run_cli("status", name, "-o", "json", env=env, timeout=120)
    try:
        image = json.loads(proc.stdout)["slurm"]["dynamic"]["image"]
    except (ValueError, KeyError, TypeError):
        return None
    return image if isinstance(image, str) and image.startswith(env["GPUPROV_BAKED_REPO"] + ":") else None


def _on(node: str, script: str, user: str = "root", timeout: int = 240) -> str:
    proc = subprocess.run(["docker", "exec", "-u", user, container(node), "bash", "-c", script],
                          capture_output=True, text=True, check=False, timeout=timeout)
    assert proc.returncode == 0, f"{node}: {script}: {proc.stdout} {proc.stderr}"
    return proc.stdout


def _states(controller: str, name: str) -> dict[str, tuple[str, str]]:
    out = _on(controller, f"sinfo --noheader --Node --nodes={name}-dy-[1-2] --format='%N|%t|%E'")
    rows = {}
    for line in out.splitlines():
        node, state, reason = line.strip().split("|", 2)
        rows[node] = (state, "" if reason == "none" else reason)
    return rows


def _when(rows, holds):
    """``rows`` where ``holds(rows)``, else None."""
    return rows if holds(rows) else None


def _wait(what, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        got = what()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


def test_bad_elastic_input_is_one_line_exit_2_and_creates_nothing(env: dict[str, str], tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("10.0.0.1\n10.0.0.2\n")
    name = f"bad-{secrets.token_hex(3)}"
    for args, needle in (
        (["--count", "2", "--scheduler", "slurm", "--max-count", "1"], "is smaller than --count 2"),
        (["--count", "1", "--scheduler", "slurm", "--max-count", "3", "--idle-minutes", "0"], "--idle-minutes"),
        (["--count", "1", "--max-count", "3"], "dynamic nodes are Slurm's"),
        (["--count", "2", "--scheduler", "slurm", "--replace-unhealthy"], "--replace-unhealthy goes with"),
        (["--provider", "static", "--hosts", str(hosts), "--scheduler", "slurm", "--max-count", "3"],
         "--max-count with --provider static"),
    ):
        proc = run_cli("up", "--name", name, *(["--provider", "docker"] if "--provider" not in args else []), *args,
                       "--yes", env=env, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert needle in proc.stderr, (args, proc.stderr)
        assert not _docker("ps", "-aq", "--filter", f"label=gpuprov.cluster={name}").strip()
        assert name not in run_cli("list", env=env).stdout


def test_up_declares_the_dynamic_nodes_powered_down_and_serves_them(cluster, env) -> None:
    name, controller, said = cluster
    assert "no image baked from this cluster for lock" in said and f"baking one from {controller}" in said, said
    assert _service_pid(env, name), said
    rows = _states(controller, name)
    assert rows == {f"{name}-{d}": ("idle~", "") for d in DYNAMIC}, rows
    assert not _docker("ps", "-aq", "--filter", f"name=^gpuprov-{name}-dy-").strip()
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    dynamic = status["slurm"]["dynamic"]
    assert (dynamic["max_count"], dynamic["dynamic"], dynamic["idle_minutes"]) == (3, 2, 1), dynamic
    assert dynamic["service"]["running"] is True and dynamic["service"]["url"].endswith("/power"), dynamic
    assert dynamic["image"] and dynamic["image"].startswith(env["GPUPROV_BAKED_REPO"] + ":"), dynamic
    assert status["slurm"]["nodes"][f"{name}-dy-1"]["state"] == "idle~", status["slurm"]
    # The power key: 0600 here, 0400 SlurmUser on the controller, the same bytes.
    key = Path(env["GPUPROV_HOME"]) / "clusters" / name / "power.key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert _on(controller, "stat -c '%a %U' /etc/slurm/gpuprov-power.key").strip() == "400 slurm"
    text = run_cli("status", name, env=env, check=True).stdout
    assert "dynamic nodes: up to 2 (max-count 3), powered down after 1 idle min" in text, text


def test_a_job_resumes_two_dynamic_nodes_and_they_power_down_when_idle(cluster, env, tmp_path) -> None:
    name, controller, _ = cluster
    # An operator's key granted after the image was baked (issue 57): a node booted from the
    # image gets it, as a play would give it (no `provision` between: the service reads the
    # record at each resume).
    alice = tmp_path / "alice_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(alice)], check=True)
    assert run_cli("access", "grant", name, "--key", f"{alice}.pub", "--as", "alice", env=env).returncode == 0
    started = time.monotonic()
    job = _on(controller, f"cd /tmp && sbatch --parsable --wait -N2 --exclude={controller} -o /tmp/ela-%j.out "
                          "--wrap 'srun hostname -s'", user="gpuprov", timeout=400).strip()
    took = time.monotonic() - started
    assert took < 120, took
    # The batch step ran on the allocation's first node: a dynamic node, whose container has it.
    first = f"{name}-dy-1"
    out = subprocess.run(["docker", "exec", f"gpuprov-{first}", "cat", f"/tmp/ela-{job}.out"],
                         capture_output=True, text=True, check=False, timeout=60).stdout
    assert sorted(out.split()) == sorted(f"{name}-{d}" for d in DYNAMIC), out
    # Booted from the cluster's image, no SSH port, slurmctld masked, the munge key 0400 munge.
    image = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["slurm"]["dynamic"]["image"]
    assert _docker("inspect", "-f", "{{.Config.Image}}", f"gpuprov-{first}").strip() == image
    assert not _docker("port", f"gpuprov-{first}").strip()
    assert _docker("exec", f"gpuprov-{first}", "readlink", "/etc/systemd/system/slurmctld.service").strip() == \
        "/dev/null"
    # (the bake leaves the image no authorized_keys of its node: alice's is the one line)
    keys = _docker("exec", f"gpuprov-{first}", "cat", "/home/gpuprov/.ssh/authorized_keys").splitlines()
    blob = alice.with_suffix(".pub").read_text().split()[1]
    assert keys == [f"ssh-ed25519 {blob} gpuprov-access:alice"], keys
    # Idle for a minute, then powered down: the containers go, Slurm shows them powered down.
    gone = _wait(lambda: not _docker("ps", "-aq", "--filter", f"name=^gpuprov-{name}-dy-").strip(), 300, 5)
    assert gone, _docker("ps", "-a", "--filter", f"name=^gpuprov-{name}-dy-")
    rows = _wait(lambda: _when(_states(controller, name), lambda r: all(s == "idle~" for s, _ in r.values())), 180, 5)
    assert rows, _states(controller, name)
    log = (Path(env["GPUPROV_HOME"]) / "clusters" / name / "power.log").read_text()
    assert f"resume {name}-dy-[1-2]: taken" in log and f"suspend {name}-dy-" in log, log


def test_a_dynamic_node_running_with_no_slurm_node_behind_it_is_removed(cluster, env) -> None:
    """FIXTURE: a container of the plain node image labelled as the cluster's dynamic node 2
    stands for one left running (its suspend lost, the service down at the time) while Slurm has
    the node powered down: the service removes it at its second check and says so."""
    name, controller, _ = cluster
    assert _states(controller, name)[f"{name}-dy-2"][0] == "idle~"
    cname = f"gpuprov-{name}-dy-2"
    _docker("run", "-d", "--name", cname, "--label", f"gpuprov.cluster={name}", "--label",
            f"gpuprov.node={name}-dy-2", "--label", "gpuprov.dynamic=1", "gpuprov/node:bookworm", "sleep", "600")
    try:
        assert _wait(lambda: not _docker("ps", "-aq", "--filter", f"name=^{cname}$").strip(), 60), "orphan kept"
        # The service says so once the container is gone (power_service._reconcile): on a loaded
        # machine that line may come a moment after the container went.
        power_log = Path(env["GPUPROV_HOME"]) / "clusters" / name / "power.log"
        said = f"orphan {name}-dy-2: running while Slurm has it idle~; removed"
        assert _wait(lambda: said in power_log.read_text(), 20, every=0.5), power_log.read_text()
    finally:
        _docker("rm", "-f", cname)


def test_a_resume_that_fails_leaves_the_node_down_with_its_reason_and_the_job_runs_once_provision_ends_it(
        cluster, env) -> None:
    """The image removed (the fault made here): the resume fails, the node is DOWN with why in
    its Reason, and (at this cluster's limit of one failure) protected mode sets the partitions
    INACTIVE, first in `status`; the job stays queued, never failed. The image back and
    `provision` run, the partitions are UP, the node back in service, and the job runs on the
    next dynamic node that resumes."""
    name, controller, _ = cluster
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    image = status["slurm"]["dynamic"]["image"]
    keep = f"{image}-kept"
    _docker("tag", image, keep)
    _docker("image", "rm", image)
    try:
        job = _on(controller, f"cd /tmp && sbatch --parsable -N1 --exclude={controller} -o /tmp/ela-%j.out "
                              "--wrap 'hostname -s'", user="gpuprov").strip()
        down = _wait(lambda: _when(_states(controller, name), lambda r: any(s.startswith("down") for s, _ in r.values())),
                     120)
        assert down, _states(controller, name)
        node, (state, reason) = next((n, r) for n, r in down.items() if r[0].startswith("down"))
        assert reason.startswith("gpuprov: resume failed:") and "is gone" in reason, down
        inactive = _wait(lambda: _when(_on(controller, "sinfo --noheader --format='%P|%a'").split(),
                                       lambda rows: rows and all(r.endswith("|inactive") for r in rows)), 60)
        assert inactive, _on(controller, "sinfo --noheader --format='%P|%a'")
        text = run_cli("status", name, env=env, check=True).stdout
        first = text.splitlines()[0]
        # (1 failure, or 2 where slurmctld resumed the other node for the job before the first's
        # INACTIVE reached it: both are counted, both DOWN)
        assert first.startswith("PROTECTED MODE since ") and re.search(r"INACTIVE after [12] failed resume", first), text
        assert f"`gpuprov provision {name}` ends it" in first, first
        assert f"{node} {state} (gpuprov: resume failed:" in text, text
        protection = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)[
            "slurm"]["dynamic"]["protection"]
        assert protection["failures"] in (1, 2) and protection["partitions"], protection
        # The job is not lost: queued.
        assert _on(controller, f"squeue --noheader --jobs={job} --format=%T").strip() == "PENDING", job
    finally:
        _docker("tag", keep, image)
        _docker("image", "rm", keep)
    # (this cluster was made with the rdma and slurm plays only: provision runs the same)
    proc = run_cli("provision", name, "--tags", "rdma,slurm", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ended = next((ln for ln in proc.stderr.splitlines() if f"{name}: protected mode ended: partition(s) " in ln), "")
    assert node in ended and ended.endswith(" back in service"), proc.stderr
    assert all(r.endswith("|up") for r in _on(controller, "sinfo --noheader --format='%P|%a'").split())
    # The failed node back in service, powering down (idle%: the drain and DOWN gone, its suspend
    # program run, SuspendTimeout to go), not powered up with no job for it.
    back = _wait(lambda: _when(_states(controller, name), lambda r: r[node][0] in ("idle%", "idle~")), 120, 2)
    assert back, _states(controller, name)
    # Slurm holds a requeued job about two minutes (its EligibleTime); an operator starts it now.
    if "JobState=PENDING" in _on(controller, f"scontrol show job {job}"):  # (on a slow machine it may be past)
        _on(controller, f"scontrol update JobId={job} StartTime=now")
    done = _wait(lambda: "JobState=COMPLETED" in _on(controller, f"scontrol show job {job}"), 240, 3)
    assert done, _on(controller, f"scontrol show job {job}") + _states(controller, name).__repr__()
    ran_on = _on(controller, f"scontrol show job {job}").split("BatchHost=", 1)[1].split()[0]
    assert ran_on.startswith(f"{name}-dy-"), ran_on
    assert json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)[
        "slurm"]["dynamic"]["protection"] is None


def test_a_dynamic_node_drained_by_its_own_health_is_powered_down(cluster, env) -> None:
    """FIXTURE: `scontrol update State=DRAIN Reason="gpuprov health: ..."` on the dynamic node the
    last job ran on stands for the slurm role's health program, which drains with that command
    and Reason (proven on static nodes: tests/e2e/test_slurm_e2e.py). The service powers the
    node down at its next check, before its idle time would: its container goes and Slurm has
    it powering down and in service again (idle%, then idle~: the drain gone), said in power.log."""
    name, controller, _ = cluster
    up = [n for n, (state, _) in _states(controller, name).items() if state == "idle"]
    assert up, _states(controller, name)
    node = up[0]
    _on(controller, f"scontrol update NodeName={node} State=DRAIN Reason='gpuprov health: FIXTURE FAIL gpu_count'")
    # Powering down (idle%) or powered down (idle~): the drain gone either way.
    back = _wait(lambda: _when(_states(controller, name), lambda r: r[node][0] in ("idle%", "idle~")), 120, 2)
    assert back, _states(controller, name)
    assert _wait(lambda: not _docker("ps", "-aq", "--filter", f"name=^gpuprov-{node}$").strip(), 30, 1)
    log = (Path(env["GPUPROV_HOME"]) / "clusters" / name / "power.log").read_text()
    assert f"unhealthy {node}: drained by its own health (gpuprov health: FIXTURE FAIL gpu_count); powered down" \
        in log, log


def test_status_asks_the_controller_whether_a_power_service_there_runs(cluster, env) -> None:
    """Where the power service runs on the controller (an elastic AWS cluster: the cluster's
    power-aws.json, written by its set-up, says so), `status` asks the controller over its
    pinned SSH whether `gpuprov-power-aws.service` is active and what its journal last said.
    FIXTURE: that file written for this local cluster (the URL alone, all status reads of it),
    and the unit a transient one (`systemd-run`) printing a line and sleeping: the reading is
    the real one, against the controller's real systemd and journal."""
    name, controller, _ = cluster
    record = Path(env["GPUPROV_HOME"]) / "clusters" / name / "power-aws.json"
    record.write_text(json.dumps({"url": "http://127.0.0.1:8741/power"}))

    def service() -> dict:
        return json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["slurm"]["dynamic"][
            "service"]

    try:
        assert service() == {"url": "http://127.0.0.1:8741/power", "running": False, "last": [],
                             "on_node": controller}
        _on(controller, "systemd-run --quiet --unit gpuprov-power-aws sh -c "
                        "'echo gpuprov power service: listening on 127.0.0.1:8741; exec sleep 300'")
        said = "gpuprov power service: listening on 127.0.0.1:8741"
        assert _wait(lambda: said in service()["last"], 30, 1), service()
        now = service()
        # The unit's journal: systemd's own lines of it (its start) and what the service printed, in
        # the order the journal has them (the service's line may come before systemd's).
        assert now["running"] is True and said in now["last"], now
        assert any(line.startswith("Started gpuprov-power-aws.service") for line in now["last"]), now
        text = run_cli("status", name, env=env, check=True).stdout
        assert f"power service running on {controller} (gpuprov-power-aws.service" in text, text
        assert f"power: {said}" in text, text
    finally:
        record.unlink(missing_ok=True)
        _on(controller, "systemctl stop gpuprov-power-aws.service 2>/dev/null || true")


def test_a_static_node_drained_by_its_own_health_is_replaced_from_the_image(cluster, env) -> None:
    """`--replace-unhealthy` (issue 56): the cluster grown by a second static node (`up`, the same
    plays), the flag given by `provision` (with those plays), that node drained with the health program's
    Reason (FIXTURE: `scontrol update`, as test_a_dynamic_node_drained_by_its_own_health_is_powered_down
    does) is replaced by the service at its next check: a new container of the same name from the
    dynamic nodes' image, its new host key pinned (gpuprov reaches it over SSH with strict checking),
    Slurm's drain lifted (idle, no Reason), the replacement in `status`. The controller is never
    replaced."""
    name, controller, _ = cluster
    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--scheduler", "slurm",
                   "--max-count", "3", "--idle-minutes", "1", "--no-accounting", "--tags", "rdma,slurm",
                   "--health", "off", "--no-verify", "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    static = [n["name"] for n in json.loads(proc.stdout)["nodes"]]
    # The choice is the cluster's (recorded by provision): the plays it names are the replacement's.
    proc = run_cli("provision", name, "--max-count", "4", "--replace-unhealthy", "--tags", "rdma,slurm",
                   env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = next(n for n in static if n != controller)
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert status["slurm"]["dynamic"]["replace_unhealthy"] is True, status["slurm"]["dynamic"]
    assert status["slurm"]["nodes"][second]["state"] == "idle", status["slurm"]
    image = status["slurm"]["dynamic"]["image"]
    before = _docker("inspect", "-f", "{{.Id}}", f"gpuprov-{second}").strip()
    assert before
    # A dynamic node up meanwhile (its container is the cluster's too): never counted as a static one.
    job = _on(controller, f"cd /tmp && sbatch --parsable -N1 --exclude={controller},{second} --wrap 'sleep 90'",
              user="gpuprov").strip()
    assert _wait(lambda: _on(controller, f"squeue --noheader --jobs={job} --format=%T").strip() == "RUNNING", 120), \
        _on(controller, f"scontrol show job {job}")
    _on(controller, f"scontrol update NodeName={second} State=DRAIN Reason='gpuprov health: FIXTURE FAIL gpu_count'")
    log = Path(env["GPUPROV_HOME"]) / "clusters" / name / "power.log"
    said = f"unhealthy {second}: replaced from {image}; its drain lifted"
    assert _wait(lambda: said in log.read_text(), 600, 5), log.read_text()[-4000:]
    assert f"unhealthy {second}: drained by its own health (gpuprov health: FIXTURE FAIL gpu_count); replacing it" \
        in log.read_text()
    after = _docker("inspect", "-f", "{{.Id}} {{.Config.Image}}", f"gpuprov-{second}").split()
    assert after[0] != before and after[1] == image, (before, after)
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert status["slurm"]["nodes"][second] == {"state": "idle", "reason": ""}, status["slurm"]
    assert [r["old"] for r in status["replaced"]] == [second] and status["replaced"][0]["new"] == second, status
    assert "drained by its own health" in status["replaced"][0]["why"], status["replaced"]
    # The new host key, pinned: gpuprov's own SSH (StrictHostKeyChecking) reaches the new node.
    ran = run_cli("exec", name, "--node", second, "--", "hostname", env=env, timeout=120)
    assert ran.returncode == 0 and second in ran.stdout, ran.stdout + ran.stderr
    assert sorted(n["name"] for n in status["nodes"]) == sorted(static)  # the dynamic node is no static one
    _on(controller, f"scancel {job}")
