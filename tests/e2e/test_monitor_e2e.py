"""`gpuprov monitor` end to end on two local nodes, through the real CLI: the monitoring role
over the cluster's pinned SSH installs Debian's node_exporter on both nodes and Prometheus
and Alertmanager on the monitoring host; Prometheus, asked over HTTP from here, has both
nodes' node_exporter targets up; `status` says where it answers, and the inventory marks the
host. (The role's idempotence and its alert rules are proven by its molecule scenario and
`promtool test rules`.)"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.conftest import run_cli, unbootstrapped_cluster

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(env):
    with unbootstrapped_cluster(env, "mon") as made:
        yield made


def test_a_node_outside_the_cluster_is_one_line_and_changes_nothing(env, cluster) -> None:
    name, _ = cluster
    proc = run_cli("monitor", name, "--on", "nosuch", env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "--on nosuch: not a node of" in proc.stderr
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert "monitoring_host" not in status["spec"] and not [r for r in status["runs"] if r["kind"] == "monitor"]


def test_monitor_scrapes_every_node_from_the_monitoring_host(env, cluster) -> None:
    name, nodes = cluster
    began = time.monotonic()
    proc = run_cli("monitor", name, "--on", nodes[1], "-o", "json", env=env, timeout=600)
    print(f"\nFIGURE gpuprov monitor, 2 fresh nodes: {time.monotonic() - began:.1f} s")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["ok"], proc.stderr[-3000:]
    assert data["host"] == nodes[1] and data["tunnel"] is None  # local nodes: reachable as they are
    assert all(data["hosts"][n]["failed"] == 0 and data["hosts"][n]["tasks"] > 0 for n in nodes), data
    url = data["prometheus"]
    assert url.startswith("http://") and url.endswith(":9090") and "0.0.0.0" not in url

    # Prometheus itself, from here: node_exporter on both nodes up (scraped every 15 s).
    deadline, targets = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=10) as r:
            active = json.load(r)["data"]["activeTargets"]
        targets = {t["labels"].get("instance"): t["health"] for t in active if t["labels"].get("job") == "node"}
        if targets == {n: "up" for n in nodes}:
            break
        time.sleep(3)
    assert targets == {n: "up" for n in nodes}, targets

    status = run_cli("status", name, env=env, check=True).stdout
    assert f"monitoring: prometheus {url} on {nodes[1]}" in status
    inventory = json.loads(run_cli("inventory", name, "-o", "json", env=env, check=True).stdout)
    marked = {h for h, v in inventory["_meta"]["hostvars"].items() if v.get("monitoring_server")}
    assert marked == {nodes[1]}
