"""On-prem hosts through the real CLI (static provider over two local nodes): the lock comes
from what the hosts are, `--no-bootstrap` still pins every key, a mixed cluster gets
the right stack on each host, and Slurm on existing hosts knows them by their own names.

The nodes are local containers: their PCI bus has no NVIDIA device. A host declared as a
p4d.24xlarge (NVSwitch) therefore gets a lock with fabric manager, and the fabric manager
play must stop on it for that reason (no NVSwitch on its bus), never skip it as a machine
"without NVSwitch". Packages come from the signed fixture repository
(tests/fixtures/aptrepo.py: FIXTURE driver and fabric manager packages).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fixtures import aptrepo

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "on-prem hosts' declared types and Slurm on existing hosts (about 5.5 minutes of two cores on a slower AMD EPYC); "
    "in `make test` the static provider adopts, pins and verifies two machines in tests/e2e/test_baked_cluster.py, "
    "the declared types and hosts files are tests/unit/test_static_hosts.py's and test_static_inventory.py's, and "
    "Slurm's names tests/e2e/test_slurm_e2e.py's; left out on 2026-12-02 (CI's time)"))]


@pytest.fixture(scope="module")
def repos():
    from gpuprov.providers.docker import bridge_gateway

    r = aptrepo.start(bridge_gateway(), ["535.309.01", "580.159.04"])
    yield r
    r.close()


@pytest.fixture(scope="module")
def machines(env: dict[str, str]):
    """Two machines that 'already exist': local nodes made without any playbook."""
    name = f"prem-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name,
                       "--no-bootstrap", "-o", "json", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        yield name, json.loads(proc.stdout)["nodes"]
    finally:
        run_cli("down", name, "--yes", env=env)
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=gpuprov.cluster={name}"],
                             capture_output=True, text=True, check=False).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", "-v", *ids], capture_output=True, check=False)


def _hosts_file(env, machines, path: Path, declared: list[dict[str, str]]) -> Path:
    name, nodes = machines
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    lines = [f"known_hosts: {cdir / 'known_hosts'}", "user: gpuprov", f"key: {cdir / 'id_ed25519'}",
             "hosts:"]
    for i, (node, extra) in enumerate(zip(nodes, declared, strict=True), 1):
        lines += [f"  - name: rack-{i}", "    address: 127.0.0.1", f"    port: {node['ssh_port']}"]
        lines += [f"    {k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_declared_p4d_gets_fabric_manager_and_a_mixed_cluster_each_its_stack(
        env, machines, repos, tmp_path) -> None:
    hosts = _hosts_file(env, machines, tmp_path / "hosts.yml",
                        [{"instance_type": "p4d.24xlarge"}, {"instance_type": "docker-node"}])
    name = f"st-{secrets.token_hex(3)}"
    # No --type: the lock comes from the hosts.
    up = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", name,
                 "--source", "mirror", "--mirror-url", repos.good_url,
                 "--mirror-key-fingerprint", repos.fingerprint, "--no-bootstrap", "-o", "json",
                 env=env)
    try:
        assert up.returncode == 0, up.stderr
        status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
        lock = status["stack"]
        assert lock["nvswitch"] is True and lock["fabricmanager"] == lock["driver"], lock
        assert "p4d.24xlarge" in lock["instance_type"] and "docker-node" in lock["instance_type"]
        assert status["state"] == "reachable"
        # --no-bootstrap pinned the keys: exec and the inventory work at once.
        assert run_cli("exec", name, "--", "true", env=env).returncode == 0
        inv = json.loads(run_cli("inventory", name, "-o", "json", env=env, check=True).stdout)
        hv = inv["_meta"]["hostvars"]
        assert hv["rack-1"]["gpuprov_expected_nvswitch"] is True
        assert hv["rack-2"]["gpuprov_expected_nvswitch"] is False

        prov = run_cli("provision", name, "--tags", "driver", "-o", "json", env=env, timeout=900)
        out = prov.stdout + prov.stderr
        assert prov.returncode == 1, out
        hosts_out = json.loads(prov.stdout)["hosts"]
        assert hosts_out["rack-1"]["failed"] >= 1, hosts_out  # stopped for its reason
        assert hosts_out["rack-2"]["failed"] == 0 and hosts_out["rack-2"]["ok"] > 0, hosts_out
        reason = [line for line in out.splitlines() if "rack-1" in line and "NVSwitch" in line]
        assert reason and any("PCI bus" in line for line in reason), out
        assert "has no NVSwitch" not in out

        verify = run_cli("verify", name, "-o", "json", env=env)
        rows = {h: {r["probe"]: r for r in rs} for h, rs in json.loads(verify.stdout)["hosts"].items()}
        fm1, fm2 = rows["rack-1"]["fabric_manager_matches_driver"], rows["rack-2"]["fabric_manager_matches_driver"]
        assert fm1["status"] == "fail", fm1
        assert fm2["status"] == "skip" and "PCI bus" in fm2["detail"], fm2
        assert "has no NVSwitch" not in verify.stdout
    finally:
        run_cli("down", name, "--yes", env=env)


def test_hosts_that_declare_nothing_are_read_off_their_pci_bus(env, machines, tmp_path) -> None:
    hosts = _hosts_file(env, machines, tmp_path / "bare.yml", [{}, {}])
    name = f"bare-{secrets.token_hex(3)}"
    up = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", name,
                 "--source", "distro", "--no-bootstrap", "-o", "json", env=env)
    try:
        assert up.returncode == 0, up.stderr
        assert "rack-1: reachable" in up.stderr and "PCI bus: 0 NVIDIA GPU(s), 0 NVSwitch" in up.stderr
        lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
        assert lock["instance_type"] == "detected:no-gpu" and lock["fabricmanager"] is None
    finally:
        run_cli("down", name, "--yes", env=env)


def test_an_unknown_declared_type_is_bad_input_and_nothing_is_recorded(env, machines, tmp_path) -> None:
    hosts = _hosts_file(env, machines, tmp_path / "typo.yml",
                        [{"instance_type": "dgx-a10"}, {"instance_type": "docker-node"}])
    proc = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", "typo",
                   "--no-bootstrap", env=env)
    assert proc.returncode == 2 and "unknown instance type 'dgx-a10'" in proc.stderr, proc.stderr
    assert "did you mean" in proc.stderr
    assert run_cli("status", "typo", env=env).returncode == 2


def test_slurm_on_existing_hosts_knows_them_by_their_own_names(env, machines, tmp_path) -> None:
    """Issue 32 on the static provider: `up --scheduler slurm --slurm-controller rack-2` over hosts
    that already exist, then `provision --tags slurm`. Slurm knows each host by the name it gives
    itself (not gpuprov's rack-N), the controller is the host named rack-2 in the hosts file, both
    hosts take work, and a job runs across both. (Last in the file: it leaves Slurm on the hosts.)"""
    hosts = _hosts_file(env, machines, tmp_path / "slurm.yml",
                        [{"instance_type": "docker-node"}, {"instance_type": "docker-node"}])
    name = f"sl-{secrets.token_hex(3)}"
    up = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", name, "--source", "distro",
                 "--scheduler", "slurm", "--slurm-controller", "rack-2", "--no-accounting", "--no-bootstrap", "-o",
                 "json", env=env)
    try:
        assert up.returncode == 0, up.stderr
        prov = run_cli("provision", name, "--tags", "slurm", env=env, timeout=900)
        assert prov.returncode == 0, prov.stdout[-3000:] + prov.stderr[-3000:]
        _, nodes = machines
        own = [_on(n["name"], "uname -n").strip() for n in nodes]
        assert own[0] != "rack-1" and own[1] != "rack-2", own
        status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
        assert status["slurm"]["controller"] == "rack-2" and status["slurm"]["error"] is None, status["slurm"]
        assert {n: s["state"] for n, s in status["slurm"]["nodes"].items()} == dict.fromkeys(own, "idle")
        assert "SlurmctldHost=" + own[1] in _on(nodes[0]["name"], "cat /etc/slurm/slurm.conf")
        assert _on(nodes[1]["name"], "systemctl is-active slurmctld").strip() == "active"
        answered = _on(nodes[0]["name"], "timeout 120 srun -N2 hostname", user="gpuprov").split()
        assert sorted(answered) == sorted(own), answered
    finally:
        run_cli("down", name, "--yes", env=env)


def _on(node: str, script: str, user: str = "root") -> str:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    proc = subprocess.run(["docker", "exec", "-u", user, "-w", "/tmp", cid, "sh", "-c", script],
                          capture_output=True, text=True, check=False, timeout=180)
    assert proc.returncode == 0, f"{node}: {script}: {proc.stderr}"
    return proc.stdout
