"""The provider interface: each provider checks its own flags; one parallel node check."""

from __future__ import annotations

import threading
import time

import pytest

from gpuprov import ssh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterSpec, get
from gpuprov.state import NodeRecord


def spec(provider: str, **kw) -> ClusterSpec:
    base = {"name": "c1", "provider": provider, "instance_type": None, "count": 1}
    return ClusterSpec(**{**base, **kw})


@pytest.mark.parametrize(
    ("provider", "kw", "message"),
    [
        ("aws", {}, "--type is required for the aws provider (`gpuprov types` lists them)"),
        ("aws", {"instance_type": "g5.xlarge", "count": 0}, "--count is required"),
        ("aws", {"instance_type": "g5.xlarge", "hosts_file": "h.yml"}, "--hosts is for --provider static"),
        ("aws", {"instance_type": "g5.xlarge", "options": {"capacity_reservation": "r-1"}},
         "--capacity-reservation r-1: expected an id like cr-0123456789abcdef0"),
        ("aws", {"instance_type": "g5.xlarge", "count": 257}, "--count 257 is more than gpuprov launches"),
        ("docker", {"count": 0}, "--count is required"),
        ("docker", {"count": -1}, "--count must be at least 1, not -1"),
        ("docker", {"options": {"disk_gb": 100}}, "--disk-gb is for --provider aws"),
        ("docker", {"options": {"allow_wide_ssh_cidr": True}}, "--allow-wide-ssh-cidr is for --provider aws"),
        ("docker", {"hosts_file": "h.yml"}, "--hosts is for --provider static"),
        ("docker", {"region": "us-east-1"}, "--region is for --provider aws"),
        ("docker", {"spot": True}, "--spot is for --provider aws"),
        ("static", {"hosts_file": "h.yml", "image": "ami-1"}, "--image is for --provider aws or docker"),
        ("static", {"hosts_file": "h.yml", "options": {"no_baked": True}}, "--no-baked is for --provider aws or docker"),
        ("static", {"hosts_file": "h.yml", "ssh_cidr": "192.0.2.1/32"}, "--ssh-cidr is for --provider aws"),
        ("docker", {"instance_type": "p4d.24xlarge"}, "only the 'docker-node' type"),
        ("static", {"count": 0}, "--provider static needs --hosts FILE"),
        ("static", {"hosts_file": "h.yml", "options": {"capacity_reservation": "cr-1"}},
         "--capacity-reservation is for --provider aws"),
    ],
)
def test_each_provider_checks_its_own_flags(provider: str, kw: dict, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        get(provider).check_spec(spec(provider, **kw))
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_check_spec_fills_the_provider_defaults() -> None:
    assert get("docker").check_spec(spec("docker")).instance_type == "docker-node"
    checked = get("static").check_spec(spec("static", count=0, hosts_file="h.yml"))
    assert checked.count == 0  # existing hosts: all of them


def test_the_aws_provider_keeps_no_state_between_calls() -> None:
    assert vars(get("aws")) == {}


def _node(name: str) -> NodeRecord:
    return NodeRecord(name=name, id=name, address="192.0.2.1", ssh_port=22, user="u", state="running")


def test_each_node_returns_results_in_node_order() -> None:
    nodes = [_node(f"n{i}") for i in range(5)]

    def check(n: NodeRecord) -> str:
        time.sleep(0.01 * (5 - int(n.name[1:])))
        return n.name.upper()

    assert ssh.each_node(nodes, check) == ["N0", "N1", "N2", "N3", "N4"]


def test_each_node_reports_every_problem_once_in_node_order() -> None:
    nodes = [_node(f"n{i}") for i in range(4)]

    def check(n: NodeRecord) -> None:
        if n.name == "n3":
            raise GpuprovError("n3: SSH not reachable")  # already named: not named twice
        if n.name == "n1":
            raise GpuprovError("connection refused")

    with pytest.raises(GpuprovError) as caught:
        ssh.each_node(nodes, check)
    assert str(caught.value) == "n1: connection refused; n3: SSH not reachable"


def test_each_node_is_bounded() -> None:
    running, peak, lock = [0], [0], threading.Lock()

    def check(n: NodeRecord) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    ssh.each_node([_node(f"n{i}") for i in range(12)], check, workers=3)
    assert peak[0] == 3


def test_each_node_lets_bugs_through() -> None:
    with pytest.raises(ZeroDivisionError):
        ssh.each_node([_node("n1")], lambda n: 1 / 0)
