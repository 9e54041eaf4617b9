"""End to end through the real CLI: Slurm on two local nodes (`provision NAME --scheduler slurm`).

Two local nodes from the node image without the GPU stack's bootstrap (Slurm needs none of it):
the rdma and slurm plays only (`--tags rdma,slurm`), so every job gets the NCCL settings the rdma
play writes. What it proves: both nodes idle in `sinfo` with the CPUs and memory their facts say,
`srun -N2` answering from both, a two-node batch job seeing the NCCL environment, one munge key
made by gpuprov (identical on both nodes, 0400 munge, its bytes nowhere in gpuprov's state or run
artifacts), bad scheduler input refused with one line and nothing recorded, a node whose
slurm.conf serves another cluster refused before anything is recorded or changed, Slurm's
accounting (on by default: slurmdbd with MariaDB on the controller) recording two users' jobs
for `sacct` and `gpuprov usage` through a second provision and restarts, its database password
in no other file, and (last, a labelled FIXTURE of device files) GRES giving a job only the GPU
it was given, its GPU in the job's accounting TRES.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import sqlite3
import subprocess
import sys
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


def _runs_of(env: dict[str, str], name: str) -> int:
    with sqlite3.connect(Path(env["GPUPROV_HOME"]) / "state.db") as db:
        return db.execute("SELECT count(*) FROM runs WHERE cluster = ?", (name,)).fetchone()[0]


def test_a_node_whose_slurm_serves_another_cluster_is_never_clobbered(cluster, env) -> None:
    """A node whose /etc/slurm/slurm.conf names another ClusterName (another site's Slurm) is
    refused before anything is recorded or changed: one line naming the node and that cluster,
    exit 2, no scheduler recorded, no run, no munge key made, the file as it was."""
    name, nodes = cluster
    second = nodes[1]
    foreign = "# Slurm of another site\nClusterName=lab-west\nSlurmctldHost=head01\n"
    _on(second, f"mkdir -p /etc/slurm && printf '{foreign}' > /etc/slurm/slurm.conf")
    try:
        before = _on(second, "sha256sum /etc/slurm/slurm.conf")
        runs = _runs_of(env, name)
        proc = run_cli("provision", name, "--scheduler", "slurm", "--tags", "rdma,slurm", env=env, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert f"{second}: its /etc/slurm/slurm.conf serves Slurm cluster 'lab-west'" in proc.stderr, proc.stderr
        assert nodes[0] not in proc.stderr, proc.stderr
        assert _scheduler_of(env, name) is None and _runs_of(env, name) == runs
        assert not (Path(env["GPUPROV_HOME"]) / "clusters" / name / "munge.key").exists()
        assert _on(second, "sha256sum /etc/slurm/slurm.conf") == before
        assert _on(second, "dpkg-query -W -f='${db:Status-Status}' slurmd 2>/dev/null || true") != "installed"
    finally:
        _on(second, "rm -f /etc/slurm/slurm.conf")


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

    # The topology Slurm schedules by (issue 59): local nodes are under one switch, their zone's,
    # so a job asking for one switch gets both.
    assert _on(first, "scontrol show config | grep '^TopologyPlugin '").split("=", 1)[1].strip() == "topology/tree"
    assert _on(first, "scontrol show topology").split()[0] == "SwitchName=zone-local"
    answered = _on(first, "srun -N2 --switches=1 hostname -s", user="gpuprov").split()
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


# A second user of the cluster (the nodes' own user is gpuprov), the same uid on every node, in an
# account of its own made with sacctmgr as docs/slurm.md shows.
OTHER_USER, OTHER_UID, ACCOUNT = "alice", 2001, "research"
# The accounting test's jobs as sacct recorded them, read again after a later provision.
RECORDED: dict[str, list[str]] = {}
# (a start time: sacct's default window starts at today's midnight, which a run may cross)
SACCT = ("sacct --allusers -X --noheader --parsable2 --starttime=2020-01-01 "
         "--format=JobID,User,Account,State,AllocTRES")


def _sacct(node: str, jobs: list[str], timeout: float = 60.0) -> dict[str, list[str]]:
    """sacct's record of ``jobs`` ({job: [user, account, state, AllocTRES]}), once every one of
    them is there and finished (slurmctld hands a job's end to slurmdbd a moment after)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r[0]: r[1:] for r in (line.split("|") for line in _on(node, SACCT).splitlines()) if r[0] in jobs}
        if (set(rows) == set(jobs) and all(r[2] == "COMPLETED" for r in rows.values())) or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def test_accounting_records_each_users_jobs_through_a_controller_reboot_and_provision(cluster, env) -> None:
    """Issue 59: accounting is on by default. slurmdbd and MariaDB run on the controller alone
    (MariaDB on loopback, slurmdbd.conf 0600 slurm); jobs of two users (the nodes' gpuprov and
    alice, in an account made with sacctmgr) are in `sacct` with their TRES, and `gpuprov usage`
    shows both users' hours (a local cluster: hours, no price); the records stay through a
    reboot of the controller and a second `provision`; the database password (made by
    gpuprov, 0600) is in no other file under the state directory, no run artifact, and on the
    nodes in slurmdbd.conf alone."""
    name, nodes = cluster
    first, second = nodes
    assert _on(first, "systemctl is-active slurmdbd mariadb").split() == ["active", "active"]
    assert _on(second, "systemctl is-active slurmdbd mariadb || true").split() == ["inactive", "inactive"]
    assert _on(first, "stat -c '%a %U' /etc/slurm/slurmdbd.conf").strip() == "600 slurm"
    assert _on(second, "test -e /etc/slurm/slurmdbd.conf && echo there || echo none").strip() == "none"
    listening = [line.split()[3] for line in _on(first, "ss -ltnH 'sport = :3306'").splitlines()]
    assert listening and all(a.startswith("127.0.0.1:") for a in listening), listening
    conf = _on(first, "scontrol show config")
    assert "accounting_storage/slurmdbd" in conf and "jobacct_gather/cgroup" in conf and "priority/multifactor" in conf
    assert _on(first, "sacctmgr --noheader --parsable2 list cluster format=cluster").split() == [name.lower()]

    for node in nodes:
        _on(node, f"id -u {OTHER_USER} >/dev/null 2>&1 || useradd -m -u {OTHER_UID} {OTHER_USER}")
    _on(first, f"sacctmgr -i add account {ACCOUNT} Description=research Organization=lab >/dev/null; "
               f"sacctmgr -i add user {OTHER_USER} DefaultAccount={ACCOUNT} >/dev/null")
    # Side by side (one CPU of each node each): gpuprov's job on both nodes, alice's two on one each.
    mine = _on(first, "cd /tmp && sbatch --parsable -N2 -o /dev/null --wrap 'sleep 4'", user="gpuprov").strip()
    theirs = [_on(first, f"cd /tmp && sbatch --parsable -N1 -o /dev/null --wrap 'sleep {s}'",
                  user=OTHER_USER).strip() for s in (3, 5)]
    rows = _sacct(first, [mine, *theirs])
    assert {j: r[:3] for j, r in rows.items()} == {
        mine: ["gpuprov", "", "COMPLETED"], **{j: [OTHER_USER, ACCOUNT, "COMPLETED"] for j in theirs}}, rows
    assert "node=2" in rows[mine][3] and all("node=1" in rows[j][3] and "cpu=" in rows[j][3] for j in theirs), rows

    def hours_by_user() -> dict[str, tuple[int, float]]:
        data = json.loads(run_cli("usage", name, "-o", "json", env=env, check=True, timeout=120).stdout)
        assert data["controller"] == first and data["by"] == "user", data
        assert all(p["usd_per_hour"] is None and p["why"] for p in data["prices"].values()), data["prices"]
        return {r["key"]: (r["jobs"], r["node_hours"]) for r in data["rows"]}

    before = hours_by_user()
    assert before[OTHER_USER][0] == 2 and before["gpuprov"][0] >= 1, before
    assert before[OTHER_USER][1] > 0 and before["gpuprov"][1] > 0, before

    # The records stay through a reboot of the controller (its container restarted: systemd
    # starts MariaDB, slurmdbd and slurmctld again, each enabled at boot; the node's SSH port may
    # move, which gpuprov reads again) and through the next test's provision
    # (test_status_shows_each_nodes_slurm_state_and_a_hand_drain_stays reads them after it).
    # (slurmdbd listens a moment after systemd says it started)
    subprocess.run(["docker", "restart", "-t", "30", container(first)], check=True, capture_output=True,
                   timeout=180)
    _on(first, "for _ in $(seq 120); do sacctmgr --noheader list cluster >/dev/null 2>&1 && exit 0; sleep 1; "
               "done; exit 1")
    assert _on(first, "systemctl is-active mariadb slurmdbd slurmctld munge").split() == ["active"] * 4
    assert _sacct(first, [mine, *theirs]) == rows
    assert {u: jobs for u, (jobs, _) in hours_by_user().items()} == {u: jobs for u, (jobs, _) in before.items()}
    RECORDED.update(rows)
    # What a person sees (shown by `pytest -rP`): sacct's records and `gpuprov usage`'s table.
    print(_on(first, SACCT.replace("--noheader ", "")))
    print(run_cli("usage", name, env=env, check=True, timeout=120).stdout)

    # The password: gpuprov's own file (0600), nowhere else under the state directory (the runs'
    # artifacts included), and on the nodes in slurmdbd.conf alone.
    home = Path(env["GPUPROV_HOME"])
    pass_file = home / "clusters" / name / "slurmdbd.pass"
    assert pass_file.stat().st_mode & 0o777 == 0o600
    password = pass_file.read_bytes()
    assert len(password) == 43
    texts = [password, password[:20], password[20:], base64.b64encode(password)[:24], password.hex().encode()[:40]]
    leaks = [str(p) for p in home.rglob("*") if p.is_file() and p != pass_file
             and any(t in p.read_bytes() for t in texts)]
    assert leaks == [], leaks
    assert any((home / "clusters" / name).rglob("job_events/*.json")), "no run artifacts were looked at"
    where = "/etc /var/log /var/lib/mysql /root /home /tmp /var/tmp"
    for node, found in ((first, ["/etc/slurm/slurmdbd.conf"]), (second, [])):
        seen = _on(node, f"grep -rlF -- '{password.decode()}' {where} 2>/dev/null || true").split()
        assert seen == found, (node, seen)


def test_slurm_account_add_makes_an_account_with_users_once_and_lists_it(cluster, env) -> None:
    """Issue 59: `gpuprov slurm account add` runs sacctmgr on the controller over the pinned SSH
    (an account and two users' associations, the real Slurm's), a second run says each is there
    and changes nothing, `slurm account list -o json` reads them back; a bad name is refused
    before anything runs."""
    name, nodes = cluster
    bad = run_cli("slurm", "account", "add", name, "vision", "--user", "alice;id", env=env)
    assert bad.returncode == 2 and "not a Slurm user name" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    added = run_cli("slurm", "account", "add", name, "vision", "--user", OTHER_USER, "--user", "gpuprov",
                    env=env, check=True, timeout=120)
    assert "account vision added" in added.stderr and f"user {OTHER_USER} added to account vision" in added.stderr
    users = _on(nodes[0], "sacctmgr -n -P list associations account=vision format=user").split()
    assert sorted(u for u in users if u) == sorted([OTHER_USER, "gpuprov"]), users
    again = run_cli("slurm", "account", "add", name, "vision", "--user", OTHER_USER, env=env, check=True, timeout=120)
    assert "account vision is there already" in again.stderr and "nothing changed" in again.stderr, again.stderr
    listed = json.loads(run_cli("slurm", "account", "list", name, "-o", "json", env=env, check=True,
                                timeout=120).stdout)
    accounts = {a["account"]: a["users"] for a in listed["accounts"]}
    assert listed["controller"] == nodes[0] and accounts["vision"] == sorted([OTHER_USER, "gpuprov"]), listed
    assert OTHER_USER in accounts.get(ACCOUNT, []), listed


def test_each_node_runs_gpuprovs_quick_health_itself(cluster, env) -> None:
    """The health program's quick level is gpuprov's own (the zipapp gpuprov built for the run,
    byte for byte), run on the node with the node's python3 and no site-packages, held to what
    `gpuprov health` holds the node to: on these healthy container nodes nothing fails, and what
    a container cannot have skips with its reason."""
    from gpuprov.health import QUICK, node_bundle

    name, nodes = cluster
    built = Path(env["GPUPROV_HOME"]) / "clusters" / name / node_bundle.NAME
    assert built.read_bytes() == node_bundle.build()
    for node in nodes:
        assert _on(node, "sha256sum /usr/local/lib/gpuprov/node-health.pyz").split()[0] == \
            hashlib.sha256(built.read_bytes()).hexdigest()
        assert _on(node, "stat -c '%a %U' /usr/local/lib/gpuprov/node-health.pyz").strip() == "644 root"
        config = json.loads(_on(node, "cat /etc/slurm/gpuprov-health.json"))
        assert config["node_check"] == "/usr/local/lib/gpuprov/node-health.pyz", config
        expect = json.loads(_on(node, f"cat {config['expect']}"))
        assert (expect["instance_type"], expect["gpus"], expect["provision"]) == (
            "docker-node", 0, f"gpuprov provision {name}"), expect
        out = _on(node, f"python3 -I -S {config['node_check']} --expect {config['expect']} --json; echo \"rc=$?\"")
        report, rc = out.rsplit("rc=", 1)
        data = json.loads(report)
        assert rc.strip() == "0" and data["ok"] is True, data
        rows = {r["check"]: r for r in data["checks"]}
        assert len(rows) == len(QUICK) and rows["gpu_count"]["status"] == "pass", rows
        skipped = {k: r["reason"] for k, r in rows.items() if r["status"] == "skip"}
        assert {"gpu_answers", "driver", "xid", "ecc"} <= set(skipped) and all(skipped.values()), skipped
        assert skipped["xid"].startswith("container node"), skipped


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


MPI_PROGRAM = ("from mpi4py import MPI; import socket; c = MPI.COMM_WORLD; "
               "print(socket.gethostname(), c.Get_rank(), c.Get_size(), c.allreduce(c.Get_rank() + 1))")
# What Docker does on every node it runs on: a bridge with the same address everywhere
# (docker0, 172.17.0.1 on a real node; here another subnet, off the nodes' own network).
SAME_BRIDGE = ("ip link show gpuprov-br0 >/dev/null 2>&1 || { ip link add gpuprov-br0 type bridge && "
               "ip addr add 172.31.254.1/24 dev gpuprov-br0 && ip link set gpuprov-br0 up; }")


def _install(nodes: list[str], packages: str) -> None:
    """Debian's packages on every node at once, as a user would add a job's runtime."""
    procs = [subprocess.Popen(["docker", "exec", container(n), "bash", "-c",
                               "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                               f"{packages} >/dev/null"], stderr=subprocess.PIPE, text=True) for n in nodes]
    for node, proc in zip(nodes, procs, strict=True):
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{node}: {packages}: {err[-2000:]}"


def test_an_mpi_program_starts_under_plain_srun_across_both_nodes(cluster, env) -> None:
    """MPI through Slurm: Debian's Open MPI (what the nccl_tests play installs; mpi4py, Debian's
    python3-mpi4py, is the MPI program here) wired up by Slurm's PMIx plugin, the slurm.conf
    default, so `srun` starts MPI ranks as written, with no --mpi and no SSH key between the
    nodes. Four ranks on two nodes, each seeing the world of four and an allreduce summing it.
    Issue 53: each node has a bridge with the same address, as Docker makes on every node it
    runs on; Open MPI left alone pairs the two bridges and the allreduce hangs until killed. The
    task environment keeps Open MPI's TCP traffic on the interface of the node's Slurm address."""
    name, nodes = cluster
    first = nodes[0]
    _install(nodes, "python3-mpi4py openmpi-bin")
    for node in nodes:
        _on(node, SAME_BRIDGE)
        iface = _on(node, "ip -o -4 addr show | awk -v a=\"$(hostname -i | awk '{print $1}')\" "
                          "'index($4, a \"/\") == 1 {print $2}'")
        prolog = _on(node, "/etc/slurm/gpuprov-task-prolog")
        assert f"export OMPI_MCA_btl_tcp_if_include={iface.strip()}" in prolog.splitlines(), (node, iface, prolog)
    assert _on(first, "scontrol show config | grep '^MpiDefault '").split("=", 1)[1].strip() == "pmix"
    out = _on(first, f"cd /tmp && timeout 60 srun -N2 --ntasks-per-node=2 python3 -c '{MPI_PROGRAM}'",
              user="gpuprov")
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert [r[1:] for r in sorted(rows, key=lambda r: int(r[1]))] == [[str(i), "4", "10"] for i in range(4)], out
    assert sorted({r[0] for r in rows}) == sorted(nodes), out
    assert not any((Path(env["GPUPROV_HOME"]) / "clusters" / name).glob("**/gpuprov-mpi-*"))


# One step of PyTorch's DistributedDataParallel over gloo, launched the usual way: MASTER_ADDR is
# the first host of the job's nodelist (a Slurm name the other node must resolve), RANK and
# WORLD_SIZE from Slurm. Each rank feeds other data; after the step DDP's averaged gradients
# leave the same weights on both: each prints its rank and the weights' sum.
DDP_STEP = """
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=50))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.full((8, 4), float(rank + 1))).sum().backward()
opt.step()
print(rank, dist.get_world_size(), round(sum(float(p.sum()) for p in model.parameters()), 6))
dist.destroy_process_group()
"""
DDP_JOB = """#!/bin/bash
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) MASTER_PORT=29517
exec srun -N2 --ntasks-per-node=1 bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec python3 /tmp/ddp_step.py'
"""


def test_a_pytorch_ddp_step_runs_across_both_nodes_by_their_slurm_names(cluster, env) -> None:
    """Issue 53: every node resolves every other node's Slurm name (the slurm play's block in
    /etc/hosts, the nodes of slurm.conf), so the usual sbatch script works as written: two ranks
    of Debian's PyTorch 1.13 agree after one DDP step, within a minute."""
    _, nodes = cluster
    first, second = nodes
    for node, other in ((first, second), (second, first)):
        addr = _on(other, "hostname -i").split()[0]
        assert _on(node, f"getent hosts {other}").split()[0] == addr, node
    _install(nodes, "python3-torch")
    for node in nodes:
        _on(node, f"cat > /tmp/ddp_step.py <<'EOS'\n{DDP_STEP}\nEOS\nchmod 0644 /tmp/ddp_step.py")
    _on(first, f"cat > /tmp/ddp.sh <<'EOS'\n{DDP_JOB}EOS")
    job = _on(first, "cd /tmp && timeout 90 sbatch --parsable --wait -N2 -t 2 -o /tmp/ddp-%j.out /tmp/ddp.sh",
              user="gpuprov").strip()
    out = _on(first, f"cat /tmp/ddp-{job}.out")
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert [r[:2] for r in rows] == [["0", "2"], ["1", "2"]], out
    assert rows[0][2] == rows[1][2], out  # the same weights on both ranks


def test_a_user_logs_in_with_gpuprov_ssh_and_submits_one_job(cluster, env, tmp_path) -> None:
    """Issue 53, section 3: `gpuprov ssh NAME -- sbatch ...` runs on the controller (the Slurm
    cluster's default node) over the pinned host key and submits one job, not one per node;
    the remote command's exit code is gpuprov's; `exec --controller` runs on the controller
    alone; `ssh-config`'s block lets plain OpenSSH log in by the node's name."""
    name, nodes = cluster
    proc = run_cli("ssh", name, "--", "sbatch", "--parsable", "--wait", "-N2", "-o", "/tmp/ssh-%j.out",
                   "--wrap", "srun hostname -s", env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    assert job.isdigit(), proc.stdout
    # one job of two tasks (the batch step runs on the allocation's first node: its output is there)
    ran = "".join(_on(n, f"cat /tmp/ssh-{job}.out 2>/dev/null || true") for n in nodes).split()
    assert sorted(ran) == sorted(nodes), ran
    assert run_cli("ssh", name, nodes[1], "--", "exit 3", env=env, timeout=60).returncode == 3
    one = run_cli("exec", name, "--controller", "--", "hostname -s", env=env, timeout=60)
    assert one.returncode == 0 and one.stdout.split() == [nodes[0], "|", nodes[0]], one.stdout
    config = tmp_path / "ssh_config"
    config.write_text(run_cli("ssh-config", name, env=env, check=True).stdout)
    plain = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", nodes[1], "hostname -s"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert plain.returncode == 0 and plain.stdout.strip() == nodes[1], plain.stderr


class _Imds:
    """FIXTURE: EC2's instance metadata service (IMDSv2) as a spot instance sees it, on this
    machine's Docker gateway: a token for a PUT, then spot/instance-action answered 404 (none
    scheduled) until ``notice`` is set, as EC2 answers; a request without the token is 401."""

    def __init__(self) -> None:
        import http.server
        import threading

        from gpuprov.providers.docker import bridge_gateway

        self.notice: bytes | None = None
        imds = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"fixture-token")

            def do_GET(self) -> None:
                if self.headers.get("X-aws-ec2-metadata-token") != "fixture-token":
                    self.send_response(401)
                elif self.path == "/latest/meta-data/spot/instance-action" and imds.notice:
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.end_headers()
                if imds.notice and self.path.endswith("/instance-action"):
                    self.wfile.write(imds.notice)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((bridge_gateway(), 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"


SPOT_JOB = """#!/bin/bash
trap 'echo "checkpoint at run ${SLURM_RESTART_COUNT:-0}" >> /tmp/spot-ckpt-$SLURM_JOB_ID' USR1
echo "run ${SLURM_RESTART_COUNT:-0} on $(hostname -s)"
[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && exit 0
for i in $(seq 60); do sleep 5 & wait; done
"""


def test_a_spot_notice_drains_the_node_signals_its_job_and_requeues_it(cluster, env, tmp_path) -> None:
    """Issue 56: the spot watcher (roles/spot_interruption) on a Slurm node, told by a FIXTURE
    IMDSv2 that EC2 will reclaim it: the node is drained with "spot interruption" and EC2's time
    as its Reason, the job running there gets USR1 (it writes its checkpoint), and after the grace
    it is requeued (Restarts=1). The job asked for this node alone, so it waits for it: resumed
    (as a replacement would be), the node runs it again, from its second run."""
    import yaml

    from gpuprov import paths

    name, nodes = cluster
    first, second = nodes
    imds = _Imds()
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    book = tmp_path / "spot.yml"
    book.write_text(yaml.safe_dump([{"name": "spot watcher", "hosts": second, "become": True, "gather_facts": True,
                                     "roles": [{"role": "spot_interruption", "vars": {
                                         "spot_interruption_imds_url": imds.url, "spot_interruption_poll_seconds": 1,
                                         "spot_interruption_slurm_grace_seconds": 5}}]}]))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(cdir / "inventory.yml"),
                           str(book)], env={**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg"),
                                            "ANSIBLE_ROLES_PATH": str(paths.playbooks_dir().parent / "roles")},
                          capture_output=True, text=True, check=False, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:]
    job, done = "", False
    try:
        _on(first, f"cat > /tmp/spot.sh <<'EOS'\n{SPOT_JOB}EOS\nchmod 0755 /tmp/spot.sh")
        job = _on(first, f"cd /tmp && sbatch --parsable --requeue -w {second} --open-mode=append "
                         "-o /tmp/spot-%j.out /tmp/spot.sh", user="gpuprov").strip()
        deadline = time.monotonic() + 60
        while "JobState=RUNNING" not in _on(first, f"scontrol show job {job}") and time.monotonic() < deadline:
            time.sleep(1)
        imds.notice = b'{"action": "terminate", "time": "2026-12-07T04:00:00Z"}'
        state, reason = _wait_state(second, first, "drained", timeout=60)
        watched = _on(second, "journalctl -u gpuprov-spot-watch --no-pager -o cat | tail -20")
        assert reason == "spot interruption at 2026-12-07T04:00:00Z" and state == "drained", (state, reason, watched)
        # requeued after the grace: pending again (the node it asked for is drained), one restart
        deadline = time.monotonic() + 60
        shown = ""
        while time.monotonic() < deadline:
            shown = _on(first, f"scontrol show job {job}")
            if "Restarts=1" in shown and "JobState=PENDING" in shown:
                break
            time.sleep(1)
        assert "Restarts=1" in shown and "JobState=PENDING" in shown, shown
        assert _on(second, f"cat /tmp/spot-ckpt-{job}").strip() == "checkpoint at run 0"
        log = _on(second, "journalctl -u gpuprov-spot-watch --no-pager -o cat")
        assert f"scancel --signal=USR1 --full {job}" in log and f"scontrol requeue {job}" in log, log
        # The node back (as a replacement would come): the job runs again, from its second run
        # (Slurm holds a requeued job for two minutes, its BeginTime: moved to now here).
        _on(first, f"scontrol update jobid={job} StartTime=now && scontrol update nodename={second} state=resume")
        deadline = time.monotonic() + 90
        while not done and time.monotonic() < deadline:
            done = "JobState=COMPLETED" in _on(first, f"scontrol show job {job}")
            time.sleep(0 if done else 2)
        out = _on(second, f"cat /tmp/spot-{job}.out")
        assert [line for line in out.splitlines() if line.startswith("run ")] == [
            f"run 0 on {second}", f"run 1 on {second}"], out
        assert "DUE TO JOB REQUEUE" in out, out  # slurmstepd's own line when the requeue ended run 0
    finally:
        if job and not done:
            _on(first, f"scancel {job}")
        _on(second, "systemctl disable --now gpuprov-spot-watch && rm -f /etc/systemd/system/gpuprov-spot-watch.service"
                    " /usr/local/sbin/gpuprov-spot-watch && systemctl daemon-reload")
        if _slurm_state(second, first)[0].startswith("drain"):
            _on(first, f"scontrol update nodename={second} state=resume")
        imds.server.shutdown()
    # Back in service (scontrol's state: sinfo of Slurm 22.05 shows such a node "mixed" for a while
    # after a requeue, seen here, though it holds no job and scontrol says IDLE).
    deadline = time.monotonic() + 60
    while " State=IDLE " not in (shown := _on(first, f"scontrol show node {second}")) and time.monotonic() < deadline:
        time.sleep(2)
    assert " State=IDLE " in shown and "Reason=" not in shown, shown


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
    # (the quick level, run by the same program, adds nothing: that node is otherwise well)
    assert state == "drained" and reason == "gpuprov health: docker_active: docker inactive", (state, reason)
    assert _slurm_state(first, first)[0] == "idle"
    _on(second, "systemctl start docker.socket docker.service && systemctl restart slurmd")
    assert _wait_state(second, first, "idle") == ("idle", "none")


def test_status_shows_each_nodes_slurm_state_and_a_hand_drain_stays(cluster, env) -> None:
    """`status` asks the controller; a node a person drained keeps its state and reason through
    a `provision` (gpuprov resumes only what it drained itself), and the accounting database its
    records (issue 59)."""
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
    assert RECORDED and _sacct(first, list(RECORDED)) == RECORDED
    # The node's health program (as slurmd runs it): every check passes, and still a node a
    # person drained is not resumed.
    _on(second, "/usr/local/sbin/gpuprov-slurm-health")
    again = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert again["slurm"]["nodes"][second] == {"state": "drained", "reason": "by hand"}


# FIXTURE (labelled): two GPUs that are only device files. Each node gets character devices
# 195:0 and 195:1 (/dev/nvidia0, /dev/nvidia1: the NVIDIA driver's major number, no driver
# behind them), and the slurm play is run by hand (the cluster's own inventory, ansible.cfg and
# vars.yml that gpuprov wrote) with the node's census given as 2 GPUs of the recorded H100's
# model instead of read from its PCI bus. Only the export of `down --keep-accounting` comes after
# it (the cluster goes there), so nothing is restored.
FIXTURE_GPUS = 2
# Run inside the job: each device opened, and what the kernel answered.
OPEN_DEVICES = """import errno, os, sys
for dev in sys.argv[1:]:
    try:
        os.close(os.open(dev, os.O_RDWR))
        print(dev, "opened")
    except OSError as exc:
        print(dev, errno.errorcode[exc.errno], exc.strerror)
"""
IN_JOB = ("bash -c 'echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; "
          "python3 /tmp/open-devices.py /dev/nvidia0 /dev/nvidia1'")


def _recorded_model() -> str:
    from gpuprov import catalog

    bus = catalog.parse_pci((Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "h100-sxm5-580"
                             / "pci.txt").read_text())
    (model,) = {catalog.GPU_BY_PCI_DEVICE[d] for d in bus["gpu_device_ids"]}
    return model


def _fixture_play(env: dict[str, str], name: str, model: str) -> None:
    from gpuprov import paths

    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    fixture_vars = {
        "gpuprov_base_gpus": FIXTURE_GPUS, "gpuprov_base_gpu_models": [model],
        # No HealthCheckProgram for this run (no services, no gpuprov quick health): gpuprov's
        # node health drains a node whose GPUs do not answer, and these device files have no
        # driver behind them.
        "slurm_health_services": [], "slurm_health_gpu_services": [], "slurm_health_node_check_src": "",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(cdir / "inventory.yml"),
         "-e", f"@{cdir / 'vars.yml'}", "-e", json.dumps(fixture_vars), str(paths.playbooks_dir() / "slurm.yml")],
        env={**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg")}, capture_output=True, text=True, check=False,
        timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_gres_on_device_files_gives_a_job_only_its_gpu(cluster, env) -> None:
    """gres.conf lists the device files (no NVML here), slurm.conf the model and count, and a
    job given one GPU gets CUDA_VISIBLE_DEVICES=0 and that device alone: the devices cgroup
    (cgroup.conf ConstrainDevices=yes) refuses /dev/nvidia1 (EPERM) while /dev/nvidia0 is let
    through to the kernel, which finds no driver (ENXIO). A job given both opens both as far."""
    name, nodes = cluster
    first = nodes[0]
    model = _recorded_model()
    gres_type = model.lower()
    for node in nodes:
        _on(node, "for i in 0 1; do [ -e /dev/nvidia$i ] || mknod -m 666 /dev/nvidia$i c 195 $i; done")
    _fixture_play(env, name, model)
    assert "ConstrainDevices=yes" in _on(first, "cat /etc/slurm/cgroup.conf").split()

    conf = _on(first, "cat /etc/slurm/slurm.conf")
    for node in nodes:
        line = next(x for x in conf.splitlines() if x.startswith(f"NodeName={node} "))
        assert f" Gres=gpu:{gres_type}:{FIXTURE_GPUS} " in line, line
    gres = _on(first, "grep -v '^#' /etc/slurm/gres.conf").splitlines()
    assert sorted(gres) == sorted(f"NodeName={n} AutoDetect=off Name=gpu Type={gres_type} File=/dev/nvidia[0-1]"
                                  for n in nodes), gres
    assert f"Gres=gpu:{gres_type}:{FIXTURE_GPUS}" in _on(first, f"scontrol show node {first}")
    assert _wait_state(first, first, "idle")[0] == "idle"

    _on(first, f"cat > /tmp/open-devices.py <<'EOS'\n{OPEN_DEVICES}EOS")
    one = _on(first, f"srun -w {first} -J gres-one --gres=gpu:1 {IN_JOB}", user="gpuprov").splitlines()
    assert one == ["CUDA_VISIBLE_DEVICES=0",
                   "/dev/nvidia0 ENXIO No such device or address",
                   "/dev/nvidia1 EPERM Operation not permitted"], one
    both = _on(first, f"srun -w {first} --gres=gpu:2 {IN_JOB}", user="gpuprov").splitlines()
    assert both == ["CUDA_VISIBLE_DEVICES=0,1",
                    "/dev/nvidia0 ENXIO No such device or address",
                    "/dev/nvidia1 ENXIO No such device or address"], both
    # Accounting (issue 59) keeps the job's GPU as TRES: gres/gpu and its type (slurm.conf's
    # AccountingStorageTRES follows the nodes' GPU model).
    assert f"AccountingStorageTRES=gres/gpu,gres/gpu:{gres_type}" in _on(first, "cat /etc/slurm/slurm.conf")
    deadline = time.monotonic() + 60
    while (tres := _on(first, "sacct -X -n -P -S 2020-01-01 --name=gres-one --format=AllocTRES").strip()) == "" \
            and time.monotonic() < deadline:
        time.sleep(2)
    assert {"gres/gpu=1", f"gres/gpu:{gres_type}=1"} <= set(tres.split(",")), tres
    # ... and `gpuprov usage` counts its GPU-hours, and the GPUs' idle hours as their own row
    # (a job of three seconds: one GPU for 0.0008 h).
    _on(first, f"srun -w {first} -J gres-hours --gres=gpu:1 sleep 3", user="gpuprov")
    deadline = time.monotonic() + 60
    while True:
        data = json.loads(run_cli("usage", name, "-o", "json", env=env, check=True, timeout=120).stdout)
        rows = {r["key"]: r for r in data["rows"]}
        if rows.get("gpuprov", {}).get("gpu_hours", 0) >= 0.0008 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert rows["gpuprov"]["gpu_hours"] >= 0.0008 and data["idle"]["gpu_hours"] > 0, data
    print(run_cli("usage", name, env=env, check=True, timeout=120).stdout)


def test_down_keep_accounting_exports_every_job_and_the_database_first(cluster, env) -> None:
    """Issue 59 (the module's last test: the cluster goes here, and the fixture's own `down`
    finds nothing left). `down --keep-accounting` exports every job's sacct line and a
    mysqldump of slurm_acct_db (root over MariaDB's socket, streamed over SSH) into
    clusters/NAME/accounting-STAMP/ (0700, kept after down): the jobs the earlier tests ran are
    in it, the dump holds the tables, and no file of it holds the database password."""
    name, _ = cluster
    home = Path(env["GPUPROV_HOME"])
    password = (home / "clusters" / name / "slurmdbd.pass").read_bytes()
    down = run_cli("down", name, "--keep-accounting", "--yes", env=env, timeout=300)
    assert down.returncode == 0, down.stderr
    (kept,) = (home / "clusters" / name).iterdir()
    assert kept.name.startswith("accounting-") and f"its accounting is kept in {kept}" in down.stderr, down.stderr
    assert kept.stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in kept.iterdir()} == {"sacct.txt": 0o600,
                                                                          "slurm_acct_db.sql": 0o600}
    lines = (kept / "sacct.txt").read_text().splitlines()
    assert lines[0] == "JobID|User|Account|Partition|NodeList|NNodes|AllocTRES|Start|End|ElapsedRaw|State", lines[:2]
    jobs = {line.split("|")[0]: line.split("|")[1] for line in lines[1:]}
    assert RECORDED and {j: jobs.get(j) for j in RECORDED} == {j: r[0] for j, r in RECORDED.items()}, jobs
    dump = (kept / "slurm_acct_db.sql").read_bytes()
    assert dump.count(b"CREATE TABLE") >= 5 and b"_job_table` (" in dump, dump[:400]
    assert [p.name for p in kept.iterdir() if password in p.read_bytes()] == []
    assert run_cli("status", name, env=env).returncode == 2
