"""End to end through the real CLI: a node that SSH cannot reach is checked once and reported
once, by verify, provision and patch, while the other node is still served.

Two local nodes without the bootstrap (cheap); node 1 is made unreachable two ways: its SSH
server stopped, and its host key swapped for another (an impostor).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(env: dict[str, str]):
    name = f"unr-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name,
                       "--no-bootstrap", "-o", "json", env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        nodes = [n["name"] for n in json.loads(proc.stdout)["nodes"]]
        assert nodes == [f"{name}-node-1", f"{name}-node-2"]
        yield name, nodes[0], nodes[1]
    finally:
        run_cli("down", name, "--yes", env=env)
        containers = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=gpuprov.cluster={name}"],
            capture_output=True, text=True, check=False).stdout.split()
        if containers:
            subprocess.run(["docker", "rm", "-f", "-v", *containers], capture_output=True, check=False)


def _container(node: str) -> str:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert cid, f"no container for {node}"
    return cid


def _lines_naming(text: str, node: str) -> list[str]:
    return [line for line in text.splitlines() if node in line]


def _one_unreachable_row(data: dict, node: str, other: str) -> dict[str, str]:
    """verify's JSON: exactly one row for ``node``, and the probes ran on ``other``."""
    assert data["ok"] is False
    assert set(data["hosts"]) == {node, other}
    rows = data["hosts"][node]
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["probe"] == "reachable" and row["status"] == "fail", row
    assert row["detail"].startswith("unreachable: ") and "\n" not in row["detail"], row
    probed = data["hosts"][other]
    assert len(probed) > 10 and all(r["probe"] != "reachable" for r in probed), probed
    assert sum(data["summary"].values()) == 1 + len(probed)
    return row


def test_stopped_ssh_is_one_line_per_command(cluster, env, tmp_path) -> None:
    """verify: one row for the dead node (not one per probe, no CommandResult repr); provision:
    one line, the other node served; patch: the node named once, never planned or drained."""
    name, node, other = cluster
    cid = _container(node)
    for unit in ("ssh.socket", "ssh"):  # the socket unit, where the image has one, first
        subprocess.run(["docker", "exec", cid, "systemctl", "stop", unit], capture_output=True,
                       check=False)
    state = subprocess.run(["docker", "exec", cid, "systemctl", "is-active", "ssh"],
                           capture_output=True, text=True, check=False).stdout.strip()
    assert state != "active", "could not stop the node's SSH server"
    try:
        proc = run_cli("verify", name, "-o", "json", env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert "CommandResult(" not in proc.stdout + proc.stderr
        row = _one_unreachable_row(json.loads(proc.stdout), node, other)
        assert "127.0.0.1" in row["detail"] or "onnection" in row["detail"], row
        named = _lines_naming(proc.stderr, node)
        assert len(named) == 1 and "UNREACHABLE" in named[0], proc.stderr

        proc = run_cli("provision", name, "--tags", "preflight", "-o", "json", env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        named = _lines_naming(proc.stderr, node)
        assert len(named) == 1 and f"{node}: UNREACHABLE " in named[0], proc.stderr
        hosts = json.loads(proc.stdout)["hosts"]
        assert hosts[node] == {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "tasks": 0}
        assert hosts[other]["tasks"] > 0 and hosts[other]["failed"] == 0
        assert hosts[other]["unreachable"] == 0

        proc = run_cli("patch", name, "--kernel", "--check", "-o", "json", env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert len(_lines_naming(proc.stderr, node)) == 1, proc.stderr
        data = json.loads(proc.stdout)
        assert data["hosts"][node]["status"] == "not-started"
        assert data["hosts"][node]["error"].startswith("unreachable: ")
        assert "plan_error" not in data["hosts"][other], data
        assert all(node not in batch for batch in data["batches"])

        # A real roll: the unreachable node is never drained; the lock does not move.
        drained = tmp_path / "drained"
        proc = run_cli("patch", name, "--kernel", "--drain", f'echo "$GPUPROV_NODE" >> {drained}',
                       "-o", "json", env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert len(_lines_naming(proc.stderr, node)) == 1, proc.stderr
        assert json.loads(proc.stdout)["hosts"][node]["status"] == "not-started"
        assert node not in (drained.read_text() if drained.exists() else "")
    finally:
        subprocess.run(["docker", "exec", cid, "systemctl", "start", "ssh"], capture_output=True,
                       check=False)


def test_changed_host_key_is_one_row_saying_so(cluster, env, tmp_path) -> None:
    name, node, other = cluster
    cid = _container(node)
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
    try:
        proc = run_cli("verify", name, "-o", "json", env=env, timeout=300)
        assert proc.returncode == 1, proc.stderr
        row = _one_unreachable_row(json.loads(proc.stdout), node, other)
        assert row["detail"].startswith("unreachable: host key does not match the pinned key"), row
        named = _lines_naming(proc.stderr, node)
        assert len(named) == 1 and "host key does not match the pinned key" in named[0], proc.stderr
    finally:
        install(saved)
    # and with its own key back, the node is probed again
    proc = run_cli("verify", name, "-o", "json", env=env, timeout=300)
    rows = json.loads(proc.stdout)["hosts"][node]
    assert len(rows) > 10 and all(r["probe"] != "reachable" for r in rows), rows


def test_a_template_smuggled_into_the_record_runs_nothing(cluster, env) -> None:
    """Issue 30 item 1, push: a template written straight into the cluster's stored lock (an
    attacker with write access to the state, or an older gpuprov; no validator saw it) reaches
    the play as text. The microcode play compares the lock's pin with what the node's apt
    sources offer (apt-cache madison on the node) and names the pin as it arrived; the pipe
    lookup in it never runs, on the controller or on a node. The lock is restored after."""
    from gpuprov.state import Store

    name, node, other = cluster
    store = Store(Path(env["GPUPROV_HOME"]) / "state.db")
    record = store.get_cluster(name)
    assert record is not None and record.lock
    lock = record.lock
    marker = f"/tmp/pwned-{name}"
    pin = f"3.2025{{{{ lookup('pipe', 'touch {marker}') }}}}"
    store.set_lock(name, {**lock, "microcode": {"intel": pin, "amd": pin}})
    try:
        proc = run_cli("provision", name, "--tags", "microcode", "-o", "json", env=env, timeout=300)
    finally:
        store.set_lock(name, lock)
    assert proc.returncode == 1, proc.stderr
    errors = json.loads(proc.stdout)["errors"]
    for host in (node, other):
        assert "the pin is " in errors[host] and pin in errors[host], errors
        assert subprocess.run(["docker", "exec", _container(host), "test", "-e", marker],
                              check=False).returncode == 1
    assert not Path(marker).exists()
    # The variables kept for running the playbooks by hand are data too: the pin as written,
    # tagged !unsafe, in a file only the owner reads; no JSON copy (read as template source).
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    by_hand = cdir / "vars.yml"
    assert by_hand.stat().st_mode & 0o077 == 0 and not (cdir / "vars.json").exists()
    assert f"!unsafe \"{pin}\"" in by_hand.read_text()
