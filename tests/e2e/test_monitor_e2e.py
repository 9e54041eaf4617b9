"""`gpuprov monitor` end to end on two local nodes, through the real CLI: the monitoring role
over the cluster's pinned SSH installs Debian's node_exporter on both nodes and Prometheus
and Alertmanager on the monitoring host; Prometheus, asked over HTTP from here, has both
nodes' node_exporter targets up; `status` says where it answers, and the inventory marks the
host. (The role's idempotence and its alert rules are proven by its molecule scenario and
`promtool test rules`.)"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_cli, unbootstrapped_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "Prometheus on the monitoring host scraping every node, a recorded DCGM exporter's row remap firing to "
    "Alertmanager (about 3 minutes of two cores); in `make test` the monitoring role's scenario installs, "
    "re-runs and probes the same stack (roles/monitoring/molecule/default), and the rules and tunnel are "
    "tests/unit/test_monitoring_unit.py's"))]


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


def test_a_recorded_dcgm_exporter_is_scraped_and_a_failed_row_remap_fires_to_alertmanager(env, cluster) -> None:
    """The node has no GPU for a real dcgm-exporter: the FIXTURE exporter serves a recorded
    page (an EC2 L4's, tests/fixtures/recordings/dcgm-exporter-published/) on node 1's :9400,
    and the test lists it as the dcgm target the role lists for a node with a GPU. Prometheus
    scrapes it; the real page raises no alert; the page edited to a failed row remap makes
    gpuprov's GpuRowRemapFailed rule fire, and Alertmanager (on the host's loopback) has it."""
    name, nodes = cluster
    url = _prometheus(env, name)  # a second run: changes nothing, says where Prometheus answers
    data = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    watched, host = nodes[0], data["spec"]["monitoring_host"]
    address = next(n["address"] for n in data["nodes"] if n["name"] == watched)
    address = _cluster_address(url, watched) or address
    pages = Path(__file__).parents[1] / "fixtures" / "recordings" / "dcgm-exporter-published"
    exporter = Path(__file__).parents[1] / "fixtures" / "dcgm_exporter" / "fixture-dcgm-exporter.py"
    node_c, host_c = _container(watched), _container(host)
    subprocess.run(["docker", "cp", str(exporter), f"{node_c}:/usr/local/bin/fixture-dcgm-exporter"], check=True)
    subprocess.run(["docker", "cp", str(pages / "l4-metrics.prom"), f"{node_c}:/var/tmp/fixture-dcgm-metrics.prom"], check=True)
    subprocess.run(["docker", "exec", "-d", node_c, "python3", "/usr/local/bin/fixture-dcgm-exporter", address,
                    "9400", "/var/tmp/fixture-dcgm-metrics.prom"], check=True)
    sd = f"- targets: ['{address}:9400']\n  labels:\n    instance: {watched}\n"
    subprocess.run(["docker", "exec", "-i", host_c, "sh", "-c", "cat > /etc/prometheus/file_sd/gpuprov-dcgm.yml"],
                   input=sd, text=True, check=True)

    temps = _wait(lambda: _query(url, f'DCGM_FI_DEV_GPU_TEMP{{instance="{watched}",job="dcgm"}}'), 120)
    assert [s["value"][1] for s in temps] == ["31"], temps  # the L4's recorded 31 C, scraped
    assert _alerts(host_c, "GpuRowRemapFailed") == []

    subprocess.run(["docker", "cp", str(pages / "l4-metrics-edited-row-remap-failure.prom"),
                    f"{node_c}:/var/tmp/fixture-dcgm-metrics.prom"], check=True)
    fired = _wait(lambda: _alerts(host_c, "GpuRowRemapFailed"), 150)
    labels = fired[0]["labels"]
    assert labels["instance"] == watched and labels["severity"] == "critical" and labels["gpu"] == "0", labels


def _prometheus(env, name: str) -> str:
    return json.loads(run_cli("monitor", name, "-o", "json", env=env, check=True).stdout)["prometheus"]


def _cluster_address(url: str, node: str) -> str | None:
    """The node's address as Prometheus scrapes its node_exporter (its cluster address)."""
    with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=10) as r:
        active = json.load(r)["data"]["activeTargets"]
    found = [t["discoveredLabels"]["__address__"] for t in active if t["labels"].get("instance") == node
             and t["labels"].get("job") == "node"]
    return found[0].rsplit(":", 1)[0] if found else None


def _container(node: str) -> str:
    return subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=10) as r:
        return json.load(r)["data"]["result"]


def _alerts(container: str, name: str) -> list[dict]:
    """Alertmanager's alerts of ``name``, asked on the monitoring host's loopback."""
    out = subprocess.run(["docker", "exec", container, "python3", "-c",
                          "import urllib.request; print(urllib.request.urlopen("
                          "'http://127.0.0.1:9093/api/v2/alerts', timeout=10).read().decode())"],
                         capture_output=True, text=True, check=True).stdout
    return [a for a in json.loads(out) if a["labels"].get("alertname") == name]


def _wait(probe, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    while True:
        found = probe()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(3)
