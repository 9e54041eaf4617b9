"""One node running both sides: Prometheus answers on the node's address, reports its own
node_exporter target up, has gpuprov's alert rules loaded and Alertmanager wired in; nothing
listens on every interface."""

import json
import re
import time

import pytest

ALERTS = {"GpuTemperatureHigh", "GpuXidCritical", "GpuEccUncorrectable", "GpuRowRemapPending",
          "GpuRowRemapFailed", "GpuNvlinkErrorsRising", "GpuMissing", "GpuHardwareSlowdown", "TargetDown"}


@pytest.fixture(scope="module")
def prometheus(host):
    """Prometheus's address from its command line (the node's cluster address)."""
    args = host.file("/etc/default/prometheus").content_string
    return re.search(r"--web\.listen-address=(\S+?)\"?\s", args + " ").group(1).rstrip('"')


def api(host, address, path):
    """GET Prometheus's HTTP API from inside the node."""
    cmd = host.run("python3 -c 'import sys, urllib.request; "
                   "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' %s",
                   f"http://{address}{path}")
    assert cmd.rc == 0, cmd.stderr
    body = json.loads(cmd.stdout)
    assert body["status"] == "success", body
    return body["data"]


@pytest.mark.parametrize("unit", ["prometheus-node-exporter", "prometheus", "prometheus-alertmanager"])
def test_services_are_enabled_and_running(host, unit):
    service = host.service(unit)
    assert service.is_enabled and service.is_running


def test_nothing_listens_on_every_interface(host, prometheus):
    assert not prometheus.startswith(("0.0.0.0", "[::]", ":"))
    listening = host.run("ss -Htln").stdout
    ports = {"9090", "9093", "9094", "9100"}
    wild = [line for line in listening.splitlines()
            if re.search(r"\s(0\.0\.0\.0|\*|\[::\]):(\d+)\s", line)
            and re.search(r"\s(0\.0\.0\.0|\*|\[::\]):(\d+)\s", line).group(2) in ports]
    assert wild == [], listening
    assert re.search(r"\s127\.0\.0\.1:9093\s", listening), listening  # Alertmanager: loopback


def test_prometheus_reports_its_node_exporter_target_up(host, prometheus):
    deadline = time.time() + 90
    while True:
        targets = api(host, prometheus, "/api/v1/targets?state=active")["activeTargets"]
        node = [t for t in targets if t["labels"].get("job") == "node"]
        if (node and all(t["health"] == "up" for t in node)) or time.time() > deadline:
            break
        time.sleep(2)
    assert len(node) == 1, targets
    assert node[0]["health"] == "up", node
    assert node[0]["scrapeUrl"].startswith(f"http://{prometheus.rsplit(':', 1)[0]}:9100/"), node
    up = api(host, prometheus, "/api/v1/query?query=up%7Bjob%3D%22node%22%7D")["result"]
    assert [r["value"][1] for r in up] == ["1"], up


def test_gpu_alert_rules_are_loaded(host, prometheus):
    groups = api(host, prometheus, "/api/v1/rules?type=alert")["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert loaded == ALERTS
    assert all(rule["health"] == "ok" for group in groups for rule in group["rules"]), groups


def test_alertmanager_is_wired_in(host, prometheus):
    deadline = time.time() + 60
    while True:
        active = api(host, prometheus, "/api/v1/alertmanagers")["activeAlertmanagers"]
        if active or time.time() > deadline:
            break
        time.sleep(2)
    assert [a["url"] for a in active] == ["http://127.0.0.1:9093/api/v2/alerts"], active


def test_no_gpu_no_dcgm_exporter_target(host):
    # A local node has no GPU on its PCI bus: dcgm-exporter's targets file is empty.
    assert host.file("/etc/prometheus/file_sd/gpuprov-dcgm.yml").content_string.strip().endswith("[]")
