"""End to end through the real CLI: a converged node carries its manifest, a no-op `provision`
runs no Ansible where it holds, and each kind of drift the plays repair is caught, planned by
`--check` without a change, and fixed by the next `provision` on that node alone.

What it costs, and why: a manifest is written by a run of the whole site (`--tags` runs read
and write none), so the two local nodes are converged with every play, from scratch (the
default local lock: Debian's driver with its DKMS build, CUDA 11.8, Docker): 1387 s on the
2-core test machine at load average 5 to 9 (the whole file 1599 s), the price of the real thing. No other file shares a baked image
it could boot from (each bakes into a repository of its own); GPUPROV_TEST_DRIFT_IMAGE=REF
boots both nodes from a baked image of the same lock instead (a developer's shortcut:
`gpuprov image list`; `up` 179 s then, at load average 5). The tests after `up` cost one
node's run for each of the plan, the repair and a missing manifest, and both nodes' `--full`:
424 s at load average 5.

Drift the plays repair on a container node, each caught and fixed: a managed file edited (the
driver's apt pin), a file removed (the unattended-upgrades guard), a held package unheld, a
held package removed, a service stopped (Docker), a service disabled (nvidia-persistenced). A
changed sysctl and a missing DKMS module for a new kernel are the unit tests'
(tests/unit/test_manifest_node.py): these plays set no sysctl on a node without EFA, and a
container has no kernel of its own.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, node_sh

pytestmark = pytest.mark.e2e

PIN = "/etc/apt/preferences.d/gpuprov-nvidia-driver.pref"
GUARD = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"
MANIFEST = "/var/lib/gpuprov/manifest.json"


@pytest.fixture(scope="module")
def cluster(env: dict[str, str]):
    """Two local nodes converged with the whole site: (name, node names)."""
    name = f"drf-{secrets.token_hex(3)}"
    image = os.environ.get("GPUPROV_TEST_DRIFT_IMAGE")
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--health", "off",
                       *(("--image", image) if image else ("--no-baked",)), "-o", "json", env=env, timeout=2400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        data = json.loads(proc.stdout)
        assert data["bootstrap"]["ok"] is True, data["bootstrap"]
        yield name, [n["name"] for n in data["nodes"]]
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def provision(name: str, env: dict[str, str], *flags: str) -> tuple[dict, str]:
    proc = run_cli("provision", name, *flags, "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def last_run(name: str, env: dict[str, str]) -> dict:
    return json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"][0]


def ansible_hosts(run: dict) -> set[str]:
    """The hosts Ansible ran a task on in a run, from its recorded events (none: no play ran)."""
    events = Path(run["artifact_dir"]) / "artifacts" / "ansible" / "job_events"
    if not events.is_dir():
        return set()
    hosts = set()
    for path in events.glob("*.json"):
        event = json.loads(path.read_text())
        if event.get("event") == "runner_on_ok" and (event.get("event_data") or {}).get("host"):
            hosts.add(event["event_data"]["host"])
    return hosts


def test_a_converged_node_holds_its_manifest_root_only(cluster, env) -> None:
    name, nodes = cluster
    spec = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["spec"]
    for node in nodes:
        assert node_sh(node, f"stat -c '%a %U' {MANIFEST}").split() == ["600", "root"]
        digest = node_sh(node, f"sha256sum {MANIFEST}").split()[0]
        record = spec["manifests"][node]
        assert (record["digest"], record["scope"]) == (digest, "site")
        items = {(i["kind"], i["name"]) for i in json.loads(node_sh(node, f"cat {MANIFEST}"))["items"]}
        assert {("path", PIN), ("path", GUARD), ("package", "nvidia-driver"), ("package", "nvidia-smi"),
                ("service", "docker"), ("service", "nvidia-persistenced")} <= items
    # The login user reads nothing of it.
    assert "Permission denied" in node_sh(nodes[0], f"su -s /bin/sh gpuprov -c 'cat {MANIFEST}' 2>&1")


def test_a_no_op_runs_no_ansible_where_the_manifest_holds(cluster, env) -> None:
    name, nodes = cluster
    data, stderr = provision(name, env)
    assert data["ok"] is True
    for node in nodes:
        assert data["manifest"][node]["action"] == "unchanged" and data["manifest"][node]["drift"] == [], stderr
        assert data["hosts"][node] == {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "tasks": 0}
        assert f"{node}: unchanged (manifest held, {data['manifest'][node]['items']} items checked)" in stderr
    run = last_run(name, env)
    assert (run["kind"], run["ok"]) == ("provision", True) and ansible_hosts(run) == set()


DRIFT = (
    f"echo '# by hand' >> {PIN}",
    f"rm {GUARD}",
    "apt-mark unhold nvidia-driver >/dev/null",
    "apt-mark unhold nvidia-smi >/dev/null && dpkg -r --force-depends nvidia-smi >/dev/null 2>&1",
    "systemctl stop docker.socket docker",
    "systemctl disable nvidia-persistenced 2>/dev/null",
)
WORDS = (
    f"{PIN}: sha256 changed",
    f"{GUARD}: missing",
    "package nvidia-driver: no longer held",
    "package nvidia-smi: removed (was {})",
    "docker: inactive (was active)",
    "nvidia-persistenced: disabled (was enabled)",
)


def test_check_plans_each_drift_item_by_item_and_changes_nothing(cluster, env) -> None:
    name, (first, second) = cluster
    smi = node_sh(first, "dpkg-query -W -f '${Version}' nvidia-smi")
    for command in DRIFT:
        node_sh(first, command)
    data, stderr = provision(name, env, "--check")
    assert data["manifest"][first]["state"] == "drifted" and data["manifest"][first]["action"] == "full run"
    assert sorted(data["manifest"][first]["drift"]) == sorted(w.format(smi) for w in WORDS)
    assert data["manifest"][second]["action"] == "unchanged"
    assert data["hosts"][second]["tasks"] == 0 < data["hosts"][first]["tasks"]
    assert f"{first}: full run (drifted: " in stderr
    # Nothing changed: the node is as the drift left it.
    assert "# by hand" in node_sh(first, f"cat {PIN}")
    assert "nvidia-driver" not in node_sh(first, "apt-mark showhold").split()
    assert node_sh(first, "systemctl is-active docker").strip() == "inactive"


def test_the_next_provision_fixes_the_drifted_node_alone(cluster, env) -> None:
    name, (first, second) = cluster
    data, _ = provision(name, env)
    assert data["ok"] is True
    assert data["manifest"][first]["action"] == "full run" and data["hosts"][first]["changed"] > 0
    assert data["manifest"][second]["action"] == "unchanged" and data["hosts"][second]["tasks"] == 0
    assert ansible_hosts(last_run(name, env)) == {first}
    assert "# by hand" not in node_sh(first, f"cat {PIN}")
    assert node_sh(first, f"test -f {GUARD} && echo yes").strip() == "yes"
    assert {"nvidia-driver", "nvidia-smi"} <= set(node_sh(first, "apt-mark showhold").split())
    assert node_sh(first, "systemctl is-active docker").strip() == "active"
    assert node_sh(first, "systemctl is-enabled nvidia-persistenced").strip() == "enabled"
    assert node_sh(first, "dpkg --audit; echo audited").strip() == "audited"
    # And the repaired node holds again.
    again, _ = provision(name, env)
    assert {n: m["action"] for n, m in again["manifest"].items()} == {first: "unchanged", second: "unchanged"}


def test_a_missing_manifest_is_a_full_run_and_full_runs_every_node(cluster, env) -> None:
    name, (first, second) = cluster
    node_sh(second, f"rm {MANIFEST}")
    data, _ = provision(name, env)
    assert data["manifest"][second]["state"] == "manifest missing" and data["hosts"][second]["tasks"] > 0
    assert data["manifest"][first]["action"] == "unchanged"
    assert node_sh(second, f"test -f {MANIFEST} && echo yes").strip() == "yes"  # written again
    full, _ = provision(name, env, "--full")
    assert full["ok"] is True and "manifest" not in full
    assert all(full["hosts"][n]["tasks"] > 0 for n in (first, second))
    assert ansible_hosts(last_run(name, env)) == {first, second}
