"""`gpuprov health` end to end on two local nodes, through the real CLI: real containers,
real SSH with the pinned host keys, the real gather script on each node. A container node
has no GPU, no kernel log of its own and no EFA: those checks skip, each with its reason;
what a container can be checked for (its GPU count against the catalog, memlock) is
checked for real and its verdict compared with what the node says itself."""

from __future__ import annotations

import json
import re
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
    rc, text = cluster_nccl.mpi_run(group, files, ["hostname"], ranks_per_node=1, timeout=120)
    hostnames = run_cli("exec", name, "--", "hostname", env=env, check=True).stdout
    assert rc == 0, text
    for line in hostnames.splitlines():
        assert line.partition(" | ")[2].strip() in text.split(), (hostnames, text)
    left = run_cli("exec", name, "--", "sh", "-c",
                   "grep -c gpuprov-mpi- ~/.ssh/authorized_keys; ls -d /dev/shm/gpuprov-mpi-* 2>/dev/null; true",
                   env=env, check=True).stdout
    assert [line.partition(" | ")[2].strip() for line in left.splitlines()] == ["0", "0"], left


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
    exit 1 with its node, check and action; `--health off` runs none."""
    from gpuprov.state import Store

    name, nodes = cluster
    store = Store(Path(env["GPUPROV_HOME"]) / "state.db")
    store.set_cluster_state(name, "bootstrapped")
    began = time.monotonic()
    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--health", "quick", "-o", "json",
                   env=env, timeout=300)
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
    runs = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]
    assert runs[0]["kind"] == "health" and runs[0]["ok"] is health["ok"]

    proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--health", "off", "-o", "json",
                   env=env, timeout=300)
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
