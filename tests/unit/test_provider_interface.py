"""The provider interface: each provider checks its own flags; one parallel node check."""

from __future__ import annotations

import threading
import time

import pytest

from gpuprov import ssh
from gpuprov.core import up
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterSpec, get, options_for
from gpuprov.providers.aws.options import AwsOptions
from gpuprov.state import NodeRecord

# The flags `gpuprov up` hands to the provider's options (gpuprov.cli.app.up).
PROVIDER_FLAGS = ("region", "image", "no_baked", "os", "ssh_cidr", "allow_wide_ssh_cidr", "spot", "disk_gb",
                  "capacity_reservation", "hosts_file")


def spec(provider: str, **kw) -> ClusterSpec:
    """A request as `gpuprov up` builds it: the provider's flags through its options type."""
    flags = {k: kw.pop(k) for k in list(kw) if k in PROVIDER_FLAGS}
    base = {"name": "c1", "provider": provider, "instance_type": None, "count": 1}
    return ClusterSpec(**{**base, **kw}, options=options_for(provider, flags))


def checked(provider: str, **kw) -> ClusterSpec:
    """The request as `up` checks it before anything is asked of the provider."""
    return up.checked(spec(provider, **kw))[1]


@pytest.mark.parametrize(
    ("provider", "kw", "message"),
    [
        ("aws", {}, "--type is required for the aws provider (`gpuprov types` lists them)"),
        ("aws", {"instance_type": "g5.xlarge", "count": None}, "--count is required"),
        ("aws", {"instance_type": "g5.xlarge", "hosts_file": "h.yml"}, "--hosts is for --provider static"),
        ("aws", {"instance_type": "g5.xlarge", "capacity_reservation": "r-1"},
         "--capacity-reservation r-1: expected an id like cr-0123456789abcdef0"),
        ("aws", {"instance_type": "g5.xlarge", "count": 257}, "--count 257 is more than gpuprov launches"),
        ("docker", {"count": None}, "--count is required"),
        ("docker", {"count": 0}, "--count must be at least 1, not 0"),
        ("docker", {"count": -1}, "--count must be at least 1, not -1"),
        ("docker", {"disk_gb": 100}, "--disk-gb is for --provider aws"),
        ("docker", {"allow_wide_ssh_cidr": True}, "--allow-wide-ssh-cidr is for --provider aws"),
        ("docker", {"hosts_file": "h.yml"}, "--hosts is for --provider static"),
        ("docker", {"region": "us-east-1"}, "--region is for --provider aws"),
        ("docker", {"spot": True}, "--spot is for --provider aws"),
        ("static", {"hosts_file": "h.yml", "image": "ami-1"}, "--image is for --provider aws or docker"),
        ("static", {"hosts_file": "h.yml", "no_baked": True}, "--no-baked is for --provider aws or docker"),
        ("static", {"hosts_file": "h.yml", "ssh_cidr": "192.0.2.1/32"}, "--ssh-cidr is for --provider aws"),
        ("docker", {"instance_type": "p4d.24xlarge"}, "only the 'docker-node' type"),
        ("static", {"count": None}, "--provider static needs --hosts FILE"),
        ("static", {"hosts_file": "h.yml", "capacity_reservation": "cr-1"},
         "--capacity-reservation is for --provider aws"),
        ("docker", {"min_count": 1}, "--min-count is for --provider aws"),
        ("aws", {"instance_type": "g5.xlarge", "keep_failed": True}, "--keep-failed goes with --min-count K"),
        ("aws", {"instance_type": "g5.xlarge", "retries": 2}, "--retries goes with --min-count K"),
        ("aws", {"instance_type": "g5.xlarge", "count": 2, "min_count": 3}, "--min-count 3 must be between 1 and --count 2"),
    ],
)
def test_each_provider_checks_its_own_flags(provider: str, kw: dict, message: str) -> None:
    with pytest.raises(BadInput) as caught:
        checked(provider, **kw)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_check_spec_fills_the_provider_defaults() -> None:
    assert checked("docker").instance_type == "docker-node"
    assert checked("static", count=None, hosts_file="h.yml").count is None  # existing hosts: all of them
    assert checked("aws", instance_type="g5.xlarge").options == AwsOptions(os="debian12")  # the default --os


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
