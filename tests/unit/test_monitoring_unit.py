"""`gpuprov monitor`'s pieces that need no node: reading Prometheus's listen address from the
file the monitoring role writes, the SSH tunnel offered for remote clusters (pinned
known_hosts, options before the destination), and which providers get one."""

from __future__ import annotations

import shlex
from pathlib import Path

from gpuprov.core import monitoring
from gpuprov.providers import get
from gpuprov.state import NodeRecord

ROLE = Path(__file__).parents[2] / "roles" / "monitoring" / "templates" / "prometheus.default.j2"


def test_the_listen_address_is_read_from_the_roles_own_file() -> None:
    line = ROLE.read_text().splitlines()[-1].replace("{{ __monitoring_prometheus_url }}", "10.0.3.7:9090") \
        .replace("{{ monitoring_retention }}", "15d")
    assert monitoring._LISTEN.search(line).group(1) == "10.0.3.7:9090"
    v6 = line.replace("10.0.3.7:9090", "[fd00::7]:9090")
    assert monitoring._LISTEN.search(v6).group(1) == "[fd00::7]:9090"


def test_the_tunnel_checks_the_pinned_host_key_and_forwards_prometheus_only(tmp_path: Path) -> None:
    from gpuprov.providers import ClusterFiles

    files = ClusterFiles(tmp_path)
    node = NodeRecord(name="c-node-1", id="i-1", address="203.0.113.7", ssh_port=22, user="admin",
                      state="running", zone="us-east-1a")
    argv = shlex.split(monitoring.tunnel(node, files, "http://10.0.3.7:9090"))
    assert argv[:2] == ["ssh", "-N"] and argv[-1] == "admin@203.0.113.7"
    assert f"UserKnownHostsFile={files.known_hosts}" in argv and "StrictHostKeyChecking=yes" in argv
    assert argv[argv.index("-L") + 1] == "9090:10.0.3.7:9090"


def test_only_local_nodes_go_without_a_tunnel() -> None:
    assert {n: get(n).nodes_on_this_host for n in ("aws", "docker", "static")} == {
        "aws": False, "docker": True, "static": False}


def test_the_recorded_host_is_read_back_and_nothing_else_is_taken() -> None:
    assert monitoring.monitoring_host({"monitoring_host": "c-node-2"}) == "c-node-2"
    assert monitoring.monitoring_host({}) is None
    assert monitoring.monitoring_host({"monitoring_host": ["x"]}) is None
