"""End to end through the real CLI: Slurm on two local nodes (`provision NAME --scheduler slurm`).

Two local nodes from the node image without the GPU stack's bootstrap (Slurm needs none of it):
the rdma and slurm plays only (`--tags rdma,slurm`), so every job gets the NCCL settings the rdma
play writes. What it proves: both nodes idle in `sinfo` with the CPUs and memory their facts say,
`srun -N2` answering from both, a two-node batch job seeing the NCCL environment, one munge key
made by gpuprov (identical on both nodes, 0400 munge, its bytes nowhere in gpuprov's state or run
artifacts), and bad scheduler input refused with one line and nothing recorded.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, container

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(env: dict[str, str]):
    name = f"slurm-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name,
                       "--no-bootstrap", "-o", "json", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        nodes = [n["name"] for n in json.loads(proc.stdout)["nodes"]]
        yield name, nodes
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def _on(node: str, script: str, user: str = "root") -> str:
    cid = container(node)
    assert cid, f"no container for {node}"
    proc = subprocess.run(["docker", "exec", "-u", user, cid, "bash", "-c", script],
                          capture_output=True, text=True, check=False, timeout=180)
    assert proc.returncode == 0, f"{node}: {script}: {proc.stderr}"
    return proc.stdout


def _scheduler_of(env: dict[str, str], name: str) -> str | None:
    with sqlite3.connect(Path(env["GPUPROV_HOME"]) / "state.db") as db:
        raw = db.execute("SELECT spec FROM clusters WHERE name = ?", (name,)).fetchone()[0]
    return (json.loads(raw).get("options") or {}).get("scheduler")


def test_bad_scheduler_input_is_one_line_exit_2_and_records_nothing(cluster, env) -> None:
    name, _ = cluster
    for args, needle in (
        (["--scheduler", "slurm", "--slurm-controller", "nosuch"], "--slurm-controller nosuch: no node of cluster"),
        (["--slurm-controller-only"], "go with --scheduler slurm"),
        (["--scheduler", "pbs"], "Invalid value for '--scheduler'"),
    ):
        proc = run_cli("provision", name, *args, env=env, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert needle in proc.stderr, proc.stderr
        assert _scheduler_of(env, name) is None
    assert not (Path(env["GPUPROV_HOME"]) / "clusters" / name / "munge.key").exists()


def test_slurm_runs_jobs_across_both_nodes_with_the_fabric_environment(cluster, env) -> None:
    name, nodes = cluster
    proc = run_cli("provision", name, "--scheduler", "slurm", "--tags", "rdma,slurm", env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert _scheduler_of(env, name) == "slurm"
    first = nodes[0]

    # Both nodes idle, with the CPUs their facts say and no more memory than they have.
    rows = dict(line.split(None, 1) for line in _on(first, "sinfo -N -h -o '%N %t %c %m'").splitlines())
    assert set(rows) == set(nodes), rows
    for node in nodes:
        state, cpus, memory = rows[node].split()
        assert state == "idle", rows
        assert int(cpus) == int(_on(node, "nproc --all")), rows
        total_mb = int(_on(node, "awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo"))
        assert 0 < int(memory) < total_mb, (rows, total_mb)

    # A job on both nodes, submitted as the nodes' user.
    answered = _on(first, "srun -N2 hostname -s", user="gpuprov").split()
    assert sorted(answered) == sorted(nodes)

    # A batch job sees the NCCL settings the rdma play wrote to /etc/nccl.conf, on both nodes.
    wanted = _on(first, "grep -E '^NCCL_SOCKET_IFNAME=' /etc/nccl.conf").strip()
    assert wanted
    job = _on(first, """cat > /tmp/envjob.sh <<'EOS'
#!/bin/bash
srun -N2 bash -c 'echo "$(hostname -s) NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME"'
EOS
cd /tmp && sbatch --parsable --wait -N2 -o /tmp/job-%j.out /tmp/envjob.sh""", user="gpuprov").strip()
    # (the batch step runs on the allocation's first node: its output is there)
    seen = "".join(_on(n, f"cat /tmp/job-{job}.out 2>/dev/null || true") for n in nodes).splitlines()
    assert sorted(line.split()[0] for line in seen) == sorted(nodes), seen
    assert all(line.split()[1] == wanted for line in seen), (seen, wanted)

    # One munge key, made by gpuprov: the same on both nodes, 0400 munge, nowhere else.
    key_file = Path(env["GPUPROV_HOME"]) / "clusters" / name / "munge.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_bytes()
    assert len(key) == 1024
    digests = {_on(n, "sha256sum /etc/munge/munge.key").split()[0] for n in nodes}
    assert len(digests) == 1
    assert {_on(n, "stat -c '%a %U' /etc/munge/munge.key").strip() for n in nodes} == {"400 munge"}
    assert digests == {hashlib.sha256(key).hexdigest()}
    home = Path(env["GPUPROV_HOME"])
    pieces = [key[i:i + 24] for i in range(0, 1024, 256)]
    texts = [*pieces, *(base64.b64encode(p)[:24] for p in pieces), *(p.hex().encode() for p in pieces)]
    leaks = [str(p) for p in home.rglob("*") if p.is_file() and p != key_file
             and any(t in p.read_bytes() for t in texts)]
    assert leaks == [], leaks


def _slurm_state(node: str, on: str) -> tuple[str, str]:
    line = _on(on, f"sinfo --noheader --Node --nodes={node} --format='%T|%E' | head -1").strip()
    state, _, reason = line.partition("|")
    return state, reason


def _wait_state(node: str, on: str, want: str, timeout: float = 90.0) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        found = _slurm_state(node, on)
        if found[0] == want or time.monotonic() > deadline:
            return found
        time.sleep(2)


def test_a_node_is_drained_by_its_own_health_and_resumed_when_it_passes(cluster, env) -> None:
    """The Docker engine (Debian's docker.io, installed on the node for this test) stopped:
    slurmd's health program drains the node with the check's name as its Reason; started
    again, the node is resumed. A service the node does not have is not checked (the other node
    has no Docker and stays idle)."""
    _, nodes = cluster
    first, second = nodes
    assert "gpuprov-slurm-health" in _on(first, "scontrol show config | grep -i HealthCheckProgram")
    _on(second, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io "
                ">/dev/null && systemctl enable --now docker")
    _on(second, "systemctl stop docker.socket docker.service && systemctl restart slurmd")
    state, reason = _wait_state(second, first, "drained")
    assert state == "drained" and reason.startswith("gpuprov health: docker_active: docker inactive"), (state, reason)
    assert _slurm_state(first, first)[0] == "idle"
    _on(second, "systemctl start docker.socket docker.service && systemctl restart slurmd")
    assert _wait_state(second, first, "idle") == ("idle", "none")


def test_status_shows_each_nodes_slurm_state_and_a_hand_drain_stays(cluster, env) -> None:
    """`status` asks the controller; a node a person drained keeps its state and reason through
    a `provision` (gpuprov resumes only what it drained itself)."""
    name, nodes = cluster
    first, second = nodes
    _on(first, f"scontrol update nodename={second} state=drain reason='by hand'")
    data = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert data["slurm"]["controller"] == first and data["slurm"]["error"] is None
    assert data["slurm"]["nodes"][first] == {"state": "idle", "reason": ""}
    assert data["slurm"]["nodes"][second]["state"] == "drained"
    assert data["slurm"]["nodes"][second]["reason"] == "by hand"
    table = run_cli("status", name, env=env, check=True).stdout
    assert f"{second} drained (by hand)" in table
    run_cli("provision", name, "--tags", "slurm", env=env, timeout=600, check=True)
    # The node's health program (as slurmd runs it): every check passes, and still a node a
    # person drained is not resumed.
    _on(second, "/usr/local/sbin/gpuprov-slurm-health")
    again = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert again["slurm"]["nodes"][second] == {"state": "drained", "reason": "by hand"}
