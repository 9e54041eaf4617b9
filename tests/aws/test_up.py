"""`gpuprov up/down/list` on EC2 (moto's server behind the test shim): the invariants.

After any `up`: exit 0 with exactly `count` running instances in one zone,
or exit 1 with none of this run's instances left running.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuprov.state import Store
from tests.aws.conftest import instances
from tests.aws.helpers import CIDR, assert_nothing_left, assert_whole_cluster, invoke, up
from tests.aws.moto_shim import Fault, Shim


def test_up_launches_exactly_count_in_one_zone_with_everything_tagged(capsys, shim: Shim, ami: str) -> None:
    code, out, err = up(capsys, ami, "train")
    assert code == 0, err
    data = json.loads(out)
    assert data["provider"] == "aws" and len(data["nodes"]) == 4
    assert [n["name"] for n in data["nodes"]] == [f"train-node-{i}" for i in range(1, 5)]
    running = assert_whole_cluster("train", 4)
    assert {n["id"] for n in data["nodes"]} == {i["InstanceId"] for i in running}
    for node in data["nodes"]:
        assert node["address"] and node["ssh_port"] == 22 and node["instance_type"] == "p4d.24xlarge"
    (run,) = shim.run_calls()
    p = run.params
    assert p["MinCount"] == p["MaxCount"] == "4"
    assert p["ClientToken"].startswith("train-")
    assert p["MetadataOptions.HttpTokens"] == "required"
    assert p["MetadataOptions.HttpPutResponseHopLimit"] == "2"
    assert p["BlockDeviceMapping.1.Ebs.VolumeType"] == "gp3"
    assert p["BlockDeviceMapping.1.Ebs.Encrypted"] == "true"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "200"
    # EFA laid out by network card: p4d.24xlarge has 4 cards, one EFA interface each.
    cards = sorted(int(p[f"NetworkInterface.{k}.NetworkCardIndex"]) for k in range(1, 5))
    assert cards == [0, 1, 2, 3] and "NetworkInterface.5.NetworkCardIndex" not in p
    assert {p[f"NetworkInterface.{k}.InterfaceType"] for k in range(1, 5)} == {"efa"}
    assert p["Placement.GroupName"] == f"gpuprov-train-{p['Placement.AvailabilityZone']}"
    kinds = {p[k] for k in p if k.startswith("TagSpecification.") and k.endswith(".ResourceType")}
    assert kinds == {"instance", "volume", "network-interface"}
    # Multi-interface launches get no public address from EC2: an elastic IP each.
    assert shim.actions().count("AllocateAddress") == 4
    state = Store().get_cluster("train")
    assert state is not None and len(state.nodes) == 4 and state.state == "launched" and state.failed_step is None


def test_ssh_is_never_open_to_the_world(capsys, shim: Shim, ami: str) -> None:
    import boto3

    code, _, err = up(capsys, ami, "sgcheck", count=1, itype="g5.xlarge")
    assert code == 0, err
    (group,) = boto3.client("ec2").describe_security_groups(
        Filters=[{"Name": "tag:gpuprov:cluster", "Values": ["sgcheck"]}])["SecurityGroups"]
    ssh_rules = [r for r in group["IpPermissions"] if r.get("FromPort") == 22]
    assert [c["CidrIp"] for r in ssh_rules for c in r["IpRanges"]] == [CIDR]
    assert not any(c["CidrIp"] == "0.0.0.0/0" for r in group["IpPermissions"] for c in r["IpRanges"])
    assert not any(r.get("Ipv6Ranges") for r in group["IpPermissions"])
    self_rule = [r for r in group["IpPermissions"] if r["IpProtocol"] == "-1"]
    assert self_rule and self_rule[0]["UserIdGroupPairs"][0]["GroupId"] == group["GroupId"]


def test_capacity_error_in_one_zone_fails_over_with_the_reason(capsys, shim: Shim, ami: str) -> None:
    shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity",
                             "We currently do not have sufficient p4d.24xlarge capacity", zone="us-east-1a"))
    code, _, err = up(capsys, ami, "failover")
    assert code == 0, err
    assert "zone us-east-1a: InsufficientInstanceCapacity" in err
    running = assert_whole_cluster("failover", 4)
    assert running[0]["Placement"]["AvailabilityZone"] == "us-east-1b"
    zones = [c.params["Placement.AvailabilityZone"] for c in shim.run_calls()]
    assert zones == ["us-east-1a", "us-east-1b"]
    # the placement group was recreated in the zone that worked; the failed zone's is gone
    assert set(shim.placement_groups) == {"gpuprov-failover-us-east-1b"}


def test_no_capacity_anywhere_leaves_nothing(capsys, shim: Shim, ami: str, gpuprov_home: Path) -> None:
    shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", "none left"))
    code, out, err = up(capsys, ami, "nocap")
    assert code == 1 and out == ""
    line = err.strip().splitlines()[-1]
    assert line.startswith("gpuprov: no capacity for 4 x p4d.24xlarge in any zone of us-east-1")
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"):
        assert f"{zone}: InsufficientInstanceCapacity" in line
    assert_nothing_left("nocap")
    assert Store().get_cluster("nocap") is None
    assert shim.placement_groups == {}
    _assert_no_tagged_leftovers("nocap")


def _assert_no_tagged_leftovers(name: str) -> None:
    import boto3

    ec2 = boto3.client("ec2")
    tag = [{"Name": "tag:gpuprov:cluster", "Values": [name]}]
    assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []
    assert ec2.describe_key_pairs(Filters=tag)["KeyPairs"] == []
    assert ec2.describe_addresses(Filters=tag)["Addresses"] == []


def test_quota_error_stops_and_names_the_quota(capsys, shim: Shim, ami: str) -> None:
    shim.quotas["L-417A185B"] = 384
    shim.faults.append(Fault("RunInstances", "VcpuLimitExceeded",
                             "You have requested more vCPU capacity than your current vCPU limit allows"))
    code, _, err = up(capsys, ami, "quota")
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert "VcpuLimitExceeded" in line and "'Running On-Demand P instances' (L-417A185B)" in line
    assert "384 vCPUs" in line
    assert len(shim.run_calls()) == 1  # a quota error is not a reason to try another zone
    assert_nothing_left("quota")


def test_throttling_is_retried_not_surfaced(capsys, shim: Shim, ami: str) -> None:
    shim.faults += [
        Fault("RunInstances", "RequestLimitExceeded", "Request limit exceeded.", times=1, status=503),
        Fault("DescribeInstances", "RequestLimitExceeded", "Request limit exceeded.", times=1, status=503),
    ]
    code, _, err = up(capsys, ami, "throttled", count=2)
    assert code == 0, err
    assert "RequestLimitExceeded" not in err
    assert len(shim.run_calls()) == 2  # one throttled, one accepted: retried by botocore
    assert_whole_cluster("throttled", 2)


def test_error_after_launch_terminates_what_this_run_launched(capsys, shim: Shim, ami: str) -> None:
    shim.faults.append(Fault("AllocateAddress", "AddressLimitExceeded", "The maximum number of addresses has been reached."))
    code, _, err = up(capsys, ami, "late")
    assert code == 1
    assert "AddressLimitExceeded" in err.strip().splitlines()[-1]
    assert "terminating the 4 instance(s) this run launched" in err
    assert_nothing_left("late")
    assert len(instances("late", ("terminated",))) == 4
    assert Store().get_cluster("late") is None
    _assert_no_tagged_leftovers("late")


def test_ctrl_c_during_launch_cleans_up(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    from gpuprov.providers.aws import launch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch, "attach_public_addresses", interrupted)
    code, _, err = up(capsys, ami, "ctrlc", count=2)
    assert code in (1, 130), err
    assert "interrupted: terminating the 2 instance(s) this run launched" in err
    assert_nothing_left("ctrlc")
    assert Store().get_cluster("ctrlc") is None


def test_termination_that_keeps_failing_leaves_ids_in_state(capsys, shim: Shim, ami: str) -> None:
    shim.faults += [
        Fault("AllocateAddress", "InternalError", "boom"),
        Fault("TerminateInstances", "UnauthorizedOperation", "You are not authorized"),
    ]
    code, _, err = up(capsys, ami, "stuck", count=2)
    assert code == 1
    line = err.strip().splitlines()[-1]
    running = instances("stuck")
    assert len(running) == 2
    for i in running:
        assert i["InstanceId"] in line
    cluster = Store().get_cluster("stuck")
    assert cluster is not None and cluster.failed_step == "launch"
    assert {n.id for n in cluster.nodes} == {i["InstanceId"] for i in running}
    # once AWS lets go, `down` finds them from state and by tag
    shim.faults.clear()
    code, _, err = invoke(capsys, "down", "stuck", "--yes")
    assert code == 0, err
    assert_nothing_left("stuck")


def test_rerun_after_kill_is_reconciled_by_tag(capsys, shim: Shim, ami: str) -> None:
    """Killed right after RunInstances (moto ignores ClientToken): the re-run launches nothing more."""
    import os
    import subprocess
    import sys

    from tests.aws.moto_shim import wait_for

    shim.hold_after_run = True
    args = [sys.executable, "-m", "gpuprov", "up", "--name", "killed", "--type", "p4d.24xlarge",
            "--count", "4", "--image", ami, "--ssh-cidr", CIDR, "--no-bootstrap", "--yes"]
    proc = subprocess.Popen(args, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(shim.held.is_set)
    finally:
        proc.kill()
        proc.wait()
    shim.hold_after_run = False
    shim.held.clear()
    shim.release.set()
    assert len(instances("killed")) == 4
    code, out, err = up(capsys, ami, "killed")
    assert code == 0, err
    assert "all 4 instance(s) exist" in err
    assert len(shim.run_calls()) == 1
    assert_whole_cluster("killed", 4)
    assert len(json.loads(out)["nodes"]) == 4


def test_rerun_launches_only_the_shortfall_in_the_same_zone(capsys, shim: Shim, ami: str) -> None:
    import boto3

    code, _, err = up(capsys, ami, "grow", count=2, itype="g5.xlarge")
    assert code == 0, err
    first = assert_whole_cluster("grow", 2)
    boto3.client("ec2").terminate_instances(InstanceIds=[first[0]["InstanceId"]])
    code, out, err = up(capsys, ami, "grow", count=2, itype="g5.xlarge")
    assert code == 0, err
    assert shim.run_calls()[-1].params["MinCount"] == "1"
    again = assert_whole_cluster("grow", 2)
    assert again[0]["Placement"]["AvailabilityZone"] == first[0]["Placement"]["AvailabilityZone"]
    names = sorted(n["name"] for n in json.loads(out)["nodes"])
    assert len(set(names)) == 2


def test_down_finds_everything_by_tag_when_state_is_gone(capsys, shim: Shim, ami: str, gpuprov_home: Path) -> None:
    import shutil

    code, _, err = up(capsys, ami, "lost", count=2)
    assert code == 0, err
    shutil.rmtree(gpuprov_home)
    code, out, _ = invoke(capsys, "list", "-o", "json")
    assert code == 0
    assert json.loads(out) == [{"name": "lost", "provider": "aws", "nodes": 2, "created": json.loads(out)[0]["created"],
                                "state": "untracked (tags only)", "price": None, "changed_by": None,
                                "changed_at": None}]
    code, _, err = invoke(capsys, "down", "lost", "--yes")
    assert code == 0, err
    assert_nothing_left("lost")
    _assert_no_tagged_leftovers("lost")
    assert shim.placement_groups == {}


def test_list_marks_a_cluster_whose_instances_are_gone(capsys, shim: Shim, ami: str) -> None:
    import boto3

    code, _, err = up(capsys, ami, "vanished", count=1, itype="g5.xlarge")
    assert code == 0, err
    ids = [i["InstanceId"] for i in instances("vanished")]
    boto3.client("ec2").terminate_instances(InstanceIds=ids)
    code, out, _ = invoke(capsys, "list", "-o", "json")
    (row,) = json.loads(out)
    assert row["name"] == "vanished" and row["nodes"] == 0 and row["state"].endswith("(missing at aws)")


def test_spot_and_capacity_reservation_and_disk_reach_run_instances(capsys, shim: Shim, ami: str) -> None:
    code, _, err = up(capsys, ami, "spotty", "--spot", "--disk-gb", "500",
                      "--capacity-reservation", "cr-0123456789abcdef0", count=1, itype="g5.xlarge")
    assert code == 0, err
    p = shim.run_calls()[-1].params
    assert p["InstanceMarketOptions.MarketType"] == "spot"
    assert p["CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"] == "cr-0123456789abcdef0"
    assert p["BlockDeviceMapping.1.Ebs.VolumeSize"] == "500"
    assert "Placement.GroupName" not in p  # no EFA on g5.xlarge: no placement group
    assert instances("spotty")[0].get("InstanceLifecycle") == "spot"
