"""End to end through the real CLI: a converged node carries its manifest, a no-op `provision`
runs no Ansible where it holds, and each kind of drift the plays repair is caught, planned by
`--check` without a change, and fixed by the next `provision` on that node alone.

What it costs, and why: the manifest is the same for any plays, so the cluster is the cheap
one of tests/e2e/test_cluster_faults.py, two local nodes bootstrapped with the preflight and
driver plays from the signed fixture repository (tests/fixtures/aptrepo.py: FIXTURE driver
packages under NVIDIA's names, real apt, real pins, holds and services), not the full stack
(the suite has no baked image to boot from; from scratch that is 12 minutes). Every
`provision` here runs the same tags, so it reads the manifest those plays wrote. About 4
minutes for `up` on a quiet machine, then one node's run for each of: the plan, the repair,
a missing manifest, and both nodes' `--full` (about 5 minutes in all here, under load).

Drift the driver play repairs on a container node, each caught and fixed: a managed file
edited (the driver's apt pin), a pin removed (the unattended-upgrades guard), a held package
unheld, a held package removed, a service disabled. A changed sysctl and a stopped service are
the unit tests' (tests/unit/test_manifest_node.py): these plays set no sysctl on a node
without EFA and start nvidia-persistenced only where there is a GPU.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, node_sh
from tests.fixtures import aptrepo

pytestmark = pytest.mark.e2e

DRIVER = "580.159.04"
TAGS = "preflight,driver"
PIN = "/etc/apt/preferences.d/gpuprov-nvidia-driver.pref"
GUARD = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"
MANIFEST = "/var/lib/gpuprov/manifest.json"


@pytest.fixture(scope="module")
def repo():
    from gpuprov.providers.docker import bridge_gateway

    repos = aptrepo.start(bridge_gateway(), [DRIVER])
    yield repos
    repos.close()


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], repo):
    """Two local nodes bootstrapped with the preflight and driver plays: (name, node names)."""
    name = f"drf-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "--source", "mirror",
                       "--mirror-url", repo.good_url, "--mirror-key-fingerprint", repo.fingerprint,
                       "--tags", TAGS, "--health", "off", "-o", "json", env=env, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        data = json.loads(proc.stdout)
        assert data["bootstrap"]["ok"] is True, data["bootstrap"]
        yield name, [n["name"] for n in data["nodes"]]
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def provision(name: str, env: dict[str, str], *flags: str) -> tuple[dict, str]:
    proc = run_cli("provision", name, "--tags", TAGS, *flags, "-o", "json", env=env, timeout=900)
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
        assert (record["digest"], record["scope"]) == (digest, "driver,preflight")
        items = {(i["kind"], i["name"]) for i in json.loads(node_sh(node, f"cat {MANIFEST}"))["items"]}
        assert {("path", PIN), ("path", GUARD), ("package", "nvidia-driver-580-open"),
                ("service", "nvidia-persistenced")} <= items
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
    "apt-mark unhold nvidia-driver-580-open >/dev/null",
    "apt-mark unhold nvidia-dkms-580-open >/dev/null && dpkg -r --force-depends nvidia-dkms-580-open >/dev/null",
    "systemctl disable nvidia-persistenced 2>/dev/null",
)
WORDS = (
    f"{PIN}: sha256 changed",
    f"{GUARD}: missing",
    "package nvidia-driver-580-open: no longer held",
    "package nvidia-dkms-580-open: removed (was 580.159.04-1)",
    "nvidia-persistenced: disabled (was enabled)",
)


def test_check_plans_each_drift_item_by_item_and_changes_nothing(cluster, env) -> None:
    name, (first, second) = cluster
    for command in DRIFT:
        node_sh(first, command)
    data, stderr = provision(name, env, "--check")
    assert data["manifest"][first]["state"] == "drifted" and data["manifest"][first]["action"] == "full run"
    assert sorted(data["manifest"][first]["drift"]) == sorted(WORDS)
    assert data["manifest"][second]["action"] == "unchanged"
    assert data["hosts"][second]["tasks"] == 0 < data["hosts"][first]["tasks"]
    assert f"{first}: full run (drifted: " in stderr
    # Nothing changed: the node is as the drift left it.
    assert "# by hand" in node_sh(first, f"cat {PIN}")
    assert "nvidia-driver-580-open" not in node_sh(first, "apt-mark showhold").split()


def test_the_next_provision_fixes_the_drifted_node_alone(cluster, env) -> None:
    name, (first, second) = cluster
    data, _ = provision(name, env)
    assert data["ok"] is True
    assert data["manifest"][first]["action"] == "full run" and data["hosts"][first]["changed"] > 0
    assert data["manifest"][second]["action"] == "unchanged" and data["hosts"][second]["tasks"] == 0
    assert ansible_hosts(last_run(name, env)) == {first}
    assert "# by hand" not in node_sh(first, f"cat {PIN}")
    assert node_sh(first, f"test -f {GUARD} && echo yes").strip() == "yes"
    assert {"nvidia-driver-580-open", "nvidia-dkms-580-open"} <= set(node_sh(first, "apt-mark showhold").split())
    assert node_sh(first, "systemctl is-enabled nvidia-persistenced").strip() == "enabled"
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
