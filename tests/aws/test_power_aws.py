"""The EC2 side of a dynamic node's resume and suspend (gpuprov.providers.aws.power, issue 56),
against the emulated EC2 (moto behind the shim, which answers a zone with no capacity as EC2
does): one instance from the cluster's launch template and baked image, tagged as that
dynamic node; a zone with no capacity skipped and resting, then asked again; every zone
refused named with EC2's code; a suspend that terminates only the cluster's dynamic nodes;
and every call allowed by docs/aws-iam-policy-power.json for a role tagged with the cluster
(IAM's context for each resource read from what EC2 holds: the image's owner and lock tag,
the instance's tags)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprov.providers.aws import power
from tests.aws import iam
from tests.aws.conftest import MOTO_AMI, REGION
from tests.aws.helpers import fixture_scontrol
from tests.aws.moto_shim import Fault
from tests.conftest import ROOT

POLICY = json.loads((ROOT / "docs" / "aws-iam-policy-power.json").read_text())
CLUSTER = "train"
ITYPE = "p4d.24xlarge"


@pytest.fixture
def ec2(shim) -> Any:
    import boto3

    return boto3.client("ec2", region_name=REGION)


def _tagged(kind: str, cluster: str, **more: str) -> list[dict[str, Any]]:
    tags = [{"Key": "gpuprov:cluster", "Value": cluster}, *({"Key": k, "Value": v} for k, v in more.items())]
    return [{"ResourceType": kind, "Tags": tags}]


@pytest.fixture
def plan(ec2, shim) -> power.Plan:
    """A cluster as `up --max-count` leaves it for the service: its launch template (tagged for
    it), a baked image of the account (tagged with its lock), the zones' default subnets."""
    group = ec2.create_security_group(GroupName=f"gpuprov-{CLUSTER}", Description="gpuprov",
                                      TagSpecifications=_tagged("security-group", CLUSTER))["GroupId"]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"gpuprov-{CLUSTER}-dynamic",
        LaunchTemplateData={"InstanceType": ITYPE, "SecurityGroupIds": [group],
                            "MetadataOptions": {"HttpTokens": "required"}},
        TagSpecifications=_tagged("launch-template", CLUSTER))["LaunchTemplate"]["LaunchTemplateId"]
    source = ec2.run_instances(ImageId=MOTO_AMI, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    image = ec2.create_image(InstanceId=source, Name=f"gpuprov-baked-{CLUSTER}",
                             TagSpecifications=[{"ResourceType": "image",
                                                 "Tags": [{"Key": "gpuprov:lock", "Value": "0a1b2c3d"}]}])["ImageId"]
    ec2.terminate_instances(InstanceIds=[source])
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"] if s["DefaultForAz"]}
    zones = sorted(subnets)[:3]
    shim.calls.clear()
    return power.Plan(CLUSTER, template, image, ITYPE, {z: subnets[z] for z in zones})


def _instance(ec2, ident: str) -> dict[str, Any]:
    return ec2.describe_instances(InstanceIds=[ident])["Reservations"][0]["Instances"][0]


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags") or []}


def _refused_by_policy(ec2, shim) -> list[str]:
    """Each authorization of the logged mutating calls that the power policy does not allow,
    for a role tagged with the cluster; the context of a resource EC2 holds is read from it."""
    principal = {"aws:PrincipalTag/gpuprov:cluster": CLUSTER, "aws:PrincipalAccount": iam.ACCOUNT}
    refused = []
    for call in iam.mutating(shim.calls):
        auths = iam.authorizations(call, CLUSTER)
        if call.action == "RunInstances":
            template = call.params["LaunchTemplate.LaunchTemplateId"]
            held = ec2.describe_launch_templates(LaunchTemplateIds=[template])["LaunchTemplates"][0]
            auths.append(iam.Authorization("ec2:RunInstances", iam.arn("launch-template", template),
                                           {f"aws:ResourceTag/{k}": v for k, v in _tags(held).items()}))
        for auth in auths:
            kind, _, ident = auth.resource.rpartition(":")[2].partition("/")
            context = dict(auth.context)
            if kind == "image":
                (image,) = ec2.describe_images(ImageIds=[ident])["Images"]
                context = {"ec2:Owner": image["OwnerId"], **{f"aws:ResourceTag/{k}": v for k, v in _tags(image).items()}}
            elif kind == "instance" and ident != "*" and call.action == "TerminateInstances":
                context = {f"aws:ResourceTag/{k}": v for k, v in _tags(_instance(ec2, ident)).items()}
            if not iam.allowed_by(POLICY, iam.Authorization(auth.action, auth.resource, {**principal, **context})):
                refused.append(f"{call.action}: {auth.action} on {auth.resource} with {context}")
    return refused


def test_a_resume_launches_one_tagged_instance_from_the_template_and_image(ec2, shim, plan) -> None:
    rests = power.Rests()
    got = power.resume(ec2, plan, f"{CLUSTER}-dy-1", rests, now=1000.0, token="r1-dy-1")
    assert isinstance(got, power.Started) and got.zone == next(iter(plan.subnets)), got
    instance = _instance(ec2, got.instance)
    assert instance["ImageId"] == plan.image and instance["InstanceType"] == ITYPE
    assert instance["SubnetId"] == plan.subnets[got.zone]
    wanted = {"gpuprov:cluster": CLUSTER, "gpuprov:node": f"{CLUSTER}-dy-1", "gpuprov:power": "dynamic"}
    assert wanted.items() <= _tags(instance).items(), _tags(instance)
    (run,) = shim.run_calls()
    assert run.params["LaunchTemplate.LaunchTemplateId"] == plan.launch_template
    assert run.params["MinCount"] == run.params["MaxCount"] == "1"
    assert run.params["MetadataOptions.HttpTokens"] == "required"
    assert power.running(ec2, CLUSTER) == {f"{CLUSTER}-dy-1": [got.instance]}
    assert _refused_by_policy(ec2, shim) == []


def test_an_efa_type_resumes_with_one_efa_interface_per_network_card(ec2, shim, plan) -> None:
    """A type with EFA (p4d: 4 network cards) gets what its static nodes get: one EFA interface
    per card, each in the cluster's group, which the template then does not hold (EC2 takes a
    launch's groups on its interfaces or on the instance, not both); the policy allows it."""
    from gpuprov.providers.aws import power_setup

    (held,) = ec2.describe_launch_templates(LaunchTemplateIds=[plan.launch_template])["LaunchTemplates"]
    group = ec2.describe_launch_template_versions(LaunchTemplateId=plan.launch_template)[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]["SecurityGroupIds"][0]
    data = power_setup.Template("p4d.24xlarge", group, "/dev/xvda", 200, efa_cards=4).data()
    assert "SecurityGroupIds" not in data
    efa_template = ec2.create_launch_template(LaunchTemplateName=f"gpuprov-{CLUSTER}-efa", LaunchTemplateData=data,
                                              TagSpecifications=_tagged("launch-template", CLUSTER))[
        "LaunchTemplate"]["LaunchTemplateId"]
    efa = power.Plan(CLUSTER, efa_template, plan.image, "p4d.24xlarge", plan.subnets, 4, group)
    shim.calls.clear()
    got = power.resume(ec2, efa, f"{CLUSTER}-dy-1", power.Rests(), now=1000.0, token="efa-1")
    assert isinstance(got, power.Started), got
    (run,) = shim.run_calls()
    p = run.params
    assert "SubnetId" not in p and "SecurityGroupId.1" not in p
    assert [p[f"NetworkInterface.{k}.NetworkCardIndex"] for k in range(1, 5)] == ["0", "1", "2", "3"]
    assert {p[f"NetworkInterface.{k}.InterfaceType"] for k in range(1, 5)} == {"efa"}
    assert {p[f"NetworkInterface.{k}.SecurityGroupId.1"] for k in range(1, 5)} == {group}
    assert {p[f"NetworkInterface.{k}.SubnetId"] for k in range(1, 5)} == {plan.subnets[got.zone]}
    assert "NetworkInterface.5.NetworkCardIndex" not in p
    assert held["LaunchTemplateName"] == f"gpuprov-{CLUSTER}-dynamic"
    assert _refused_by_policy(ec2, shim) == []


def test_a_dynamic_node_joins_the_static_nodes_placement_group_in_their_zone(ec2, shim, plan) -> None:
    """In the zone of the static nodes' cluster placement group a dynamic node is launched into
    it (the same spine for NCCL); a group with no room is EC2's capacity answer, and the next
    zone launches the node outside any group. The policy allows the cluster's group alone."""
    first, second = list(plan.subnets)[:2]
    group = f"gpuprov-{CLUSTER}-{first}"
    ec2.create_placement_group(GroupName=group, Strategy="cluster", TagSpecifications=_tagged("placement-group", CLUSTER))
    spine = power.Plan(CLUSTER, plan.launch_template, plan.image, ITYPE, plan.subnets, placement_groups={first: group})
    shim.calls.clear()
    got = power.resume(ec2, spine, f"{CLUSTER}-dy-1", power.Rests(), now=1000.0, token="pg-1")
    assert isinstance(got, power.Started) and got.zone == first, got
    (run,) = shim.run_calls()
    assert run.params["Placement.GroupName"] == group
    assert _refused_by_policy(ec2, shim) == []
    shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", zone=first, times=1))
    shim.calls.clear()
    got = power.resume(ec2, spine, f"{CLUSTER}-dy-2", power.Rests(), now=1000.0, token="pg-2")
    assert isinstance(got, power.Started) and got.zone == second, got
    assert "Placement.GroupName" not in shim.run_calls()[-1].params


def test_a_zone_without_capacity_rests_and_the_next_zone_launches(ec2, shim, plan, tmp_path) -> None:
    first, second, _ = plan.subnets
    shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", zone=first))
    rests = power.Rests.load(tmp_path / "rests.json")
    got = power.resume(ec2, plan, f"{CLUSTER}-dy-1", rests, now=1000.0, token="r1-dy-1")
    assert isinstance(got, power.Started) and got.zone == second, got
    # The first zone rests: the next resume does not ask it, and a restarted service knows.
    again = power.resume(ec2, plan, f"{CLUSTER}-dy-2", power.Rests.load(tmp_path / "rests.json"),
                         now=1000.0 + power.REST_S - 1, token="r2-dy-2")
    assert isinstance(again, power.Started) and again.zone == second
    zones = [c.params["Placement.AvailabilityZone"] for c in shim.run_calls()]
    assert zones == [first, second, second], zones
    # Its rest over, the zone is asked again, and has capacity now.
    shim.faults[0].times = 0
    later = power.resume(ec2, plan, f"{CLUSTER}-dy-3", rests, now=1000.0 + power.REST_S + 1, token="r3-dy-3")
    assert isinstance(later, power.Started) and later.zone == first, later
    assert _refused_by_policy(ec2, shim) == []


def test_no_zone_with_capacity_refuses_the_node_with_ec2s_code(ec2, shim, plan) -> None:
    for zone in plan.subnets:
        shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", zone=zone))
    rests = power.Rests()
    got = power.resume(ec2, plan, f"{CLUSTER}-dy-1", rests, now=1000.0, token="r1-dy-1")
    assert isinstance(got, power.Refused) and got.code == "InsufficientInstanceCapacity", got
    assert str(got) == f"no capacity for {ITYPE}: " + "; ".join(f"{z} InsufficientInstanceCapacity"
                                                                    for z in plan.subnets)
    # Every zone resting: the next resume asks EC2 nothing and says so.
    shim.calls.clear()
    resting = power.resume(ec2, plan, f"{CLUSTER}-dy-2", rests, now=1001.0, token="r2-dy-2")
    assert isinstance(resting, power.Refused) and resting.code == "" and shim.run_calls() == []
    assert str(resting).startswith(f"no capacity for {ITYPE}: {next(iter(plan.subnets))} resting 599 s")
    assert power.running(ec2, CLUSTER) == {}


def test_a_refusal_that_is_not_capacity_is_raised(ec2, shim, plan) -> None:
    shim.faults.append(Fault("RunInstances", "VcpuLimitExceeded"))
    with pytest.raises(Exception, match="VcpuLimitExceeded"):
        power.resume(ec2, plan, f"{CLUSTER}-dy-1", power.Rests(), now=1000.0, token="r1-dy-1")
    assert len(shim.run_calls()) == 1  # not tried in the next zone


def test_a_suspend_terminates_only_the_named_dynamic_nodes_of_the_cluster(ec2, shim, plan) -> None:
    rests = power.Rests()
    one, two = (power.resume(ec2, plan, f"{CLUSTER}-dy-{i}", rests, now=1000.0, token=f"r-dy-{i}") for i in (1, 2))
    static = ec2.run_instances(ImageId=plan.image, MinCount=1, MaxCount=1,
                               TagSpecifications=_tagged("instance", CLUSTER))["Instances"][0]["InstanceId"]
    other = ec2.run_instances(ImageId=plan.image, MinCount=1, MaxCount=1,
                              TagSpecifications=_tagged("instance", "other", **{"gpuprov:power": "dynamic",
                                                                                "gpuprov:node": f"{CLUSTER}-dy-1"})
                              )["Instances"][0]["InstanceId"]
    shim.calls.clear()
    assert power.suspend(ec2, CLUSTER, [f"{CLUSTER}-dy-1"]) == [one.instance]
    assert _instance(ec2, one.instance)["State"]["Name"] in ("shutting-down", "terminated")
    for kept in (two.instance, static, other):
        assert _instance(ec2, kept)["State"]["Name"] in ("pending", "running"), kept
    assert power.running(ec2, CLUSTER) == {f"{CLUSTER}-dy-2": [two.instance]}
    assert power.suspend(ec2, CLUSTER, [f"{CLUSTER}-dy-1"]) == []  # already gone: nothing to do
    assert power.suspend(ec2, CLUSTER, []) == []
    assert _refused_by_policy(ec2, shim) == []


def _service_config(plan: power.Plan, tmp_path: Path, key: Path, count: int) -> Path:
    """The service's configuration for ``plan``, as gpuprov writes it: its path."""
    config = tmp_path / "power-aws.json"
    config.write_text(json.dumps({
        "cluster": CLUSTER, "region": REGION, "launch_template": plan.launch_template, "image": plan.image,
        "instance_type": ITYPE, "subnets": [[z, s] for z, s in plan.subnets.items()], "count": count, "port": 0,
        "key_file": str(key), "rests": str(tmp_path / "rests.json")}))
    return config


def test_the_controllers_service_takes_the_power_programs_requests(ec2, shim, plan, tmp_path, monkeypatch) -> None:
    """The service on the controller (gpuprov.slurm.power_aws_node) with slurmctld's own power
    program (roles/slurm/files/gpuprov-slurm-power) sending it signed requests: two dynamic nodes
    resumed, a third that no zone can take set DOWN with EC2's code, one suspended, one whose
    resume timed out set DOWN and terminated; a request signed with another key refused."""
    import subprocess
    import sys
    import threading
    import time

    from gpuprov.slurm import power_aws_node

    path, log = fixture_scontrol(tmp_path)
    monkeypatch.setenv("PATH", path)
    key = tmp_path / "power.key"
    key.write_bytes(b"k" * 32)
    config = _service_config(plan, tmp_path, key, count=3)
    stop, urls = threading.Event(), []
    service = threading.Thread(target=power_aws_node.serve, args=(config, stop, ec2),
                               kwargs={"on_listening": urls.append}, daemon=True)
    service.start()

    def program(action: str, hostlist: str, key_file: str = str(key)) -> subprocess.CompletedProcess[str]:
        link = tmp_path / f"gpuprov-slurm-{action}"
        if not link.exists():
            link.symlink_to(ROOT / "roles" / "slurm" / "files" / "gpuprov-slurm-power")
        program_config = tmp_path / "gpuprov-power.json"
        program_config.write_text(json.dumps({"url": urls[0], "key_file": key_file}))
        return subprocess.run([sys.executable, str(link), "--config", str(program_config), hostlist],
                              capture_output=True, text=True, timeout=60, check=False)

    def until(predicate: Any, what: str) -> None:
        deadline = time.monotonic() + 60
        while not predicate():
            assert time.monotonic() < deadline, what
            time.sleep(0.2)

    try:
        until(lambda: urls, "the service did not listen")
        assert program("resume", f"{CLUSTER}-dy-[1-2]").returncode == 0
        until(lambda: len(power.running(ec2, CLUSTER)) == 2, "two dynamic nodes not launched")
        for zone in plan.subnets:
            shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", zone=zone))
        assert program("resume", f"{CLUSTER}-dy-3").returncode == 0
        until(lambda: log.exists(), "the third node was not set DOWN")
        (down,) = [json.loads(line) for line in log.read_text().splitlines()]
        assert down[:3] == ["update", f"NodeName={CLUSTER}-dy-3", "State=DOWN"], down
        assert down[3].startswith(f"Reason=gpuprov: resume failed: no capacity for {ITYPE}: "
                                  f"{next(iter(plan.subnets))} InsufficientInstanceCapacity"), down
        assert program("suspend", f"{CLUSTER}-dy-1").returncode == 0
        until(lambda: list(power.running(ec2, CLUSTER)) == [f"{CLUSTER}-dy-2"], "dy-1 not terminated")
        assert program("resume-failed", f"{CLUSTER}-dy-2").returncode == 0
        until(lambda: power.running(ec2, CLUSTER) == {}, "dy-2 not terminated")
        last = json.loads(log.read_text().splitlines()[-1])
        assert last == ["update", f"NodeName={CLUSTER}-dy-2", "State=DOWN",
                        "Reason=gpuprov: did not register within ResumeTimeout"], last
        other = tmp_path / "other.key"
        other.write_bytes(b"x" * 32)
        refused = program("resume", f"{CLUSTER}-dy-1", key_file=str(other))
        assert refused.returncode == 1 and "refused (403" in refused.stderr, refused.stderr
        # Nothing outside the cluster's dynamic nodes: a static node's name is refused too.
        assert program("suspend", f"{CLUSTER}-node-1").returncode == 1
    finally:
        stop.set()
        service.join(timeout=10)
    assert _refused_by_policy(ec2, shim) == []


GOOD = {"cluster": CLUSTER, "region": REGION, "launch_template": "lt-0123456789abcdef0", "image": "ami-0123456789abcdef0",
        "instance_type": ITYPE, "subnets": [["us-east-1a", "subnet-0123456789abcdef0"]], "count": 2, "port": 0,
        "key_file": "/etc/slurm/gpuprov-power.key", "rests": "/var/lib/gpuprov/power-rests.json"}


@pytest.mark.parametrize(("change", "named"), [
    ({"launch_template": "lt-0123\nState=DOWN"}, "launch_template"),
    ({"image": "ami-../../etc"}, "image"),
    ({"cluster": "Train Cluster"}, "cluster"),
    ({"subnets": [["us-east-1a", "subnet-0123 --x"]]}, "subnets"),
    ({"subnets": []}, "subnets"),
    ({"count": True}, "count"),
    ({"key_file": "power.key"}, "key_file"),
    ({"join": {"controller_addr": "ctl.internal\nState=DOWN"}}, "join"),
    ({"join": {"controller_addr": "10.0.0.5", "deadline_s": 5}}, "join"),
    ({"join": {"controller_addr": "10.0.0.5", "munge_key": "munge.key"}}, "join"),
    ({"join": {"controller_addr": "10.0.0.5", "login_key": "/root/.ssh/id_ed25519"}}, "join"),
    ({"efa_cards": 33, "security_group": "sg-0123456789abcdef0"}, "efa_cards"),
    ({"efa_cards": 4}, "security_group"),
    ({"efa_cards": 4, "security_group": "sg-0123 --x"}, "security_group"),
    ({"placement_groups": [["us-east-1a", "someone-elses-group"]]}, "placement_groups"),
    ({"placement_groups": [["us-east-1a"]]}, "placement_groups"),
])
def test_the_services_configuration_is_checked_before_any_value_is_used(tmp_path, change, named) -> None:
    from gpuprov.errors import GpuprovError
    from gpuprov.slurm import power_aws_node

    path = tmp_path / "power-aws.json"
    path.write_text(json.dumps(GOOD))
    assert power_aws_node.load(path) == GOOD
    joining = {**GOOD, "join": {"controller_addr": "10.0.0.5", "munge_key": "/etc/munge/munge.key", "deadline_s": 300}}
    path.write_text(json.dumps(joining))
    assert power_aws_node.load(path) == joining
    path.write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(GpuprovError, match=f": {named}: "):
        power_aws_node.load(path)


def test_the_controllers_check_powers_down_the_unhealthy_and_terminates_orphans(ec2, shim, plan, tmp_path,
                                                                                monkeypatch, capsys) -> None:
    """The service's periodic check with this machine's stand-ins for the controller's sinfo
    (FIXTURE: it prints what the test writes, as `sinfo --Node --format=%N|%T|%E` does) and
    scontrol: an instance whose node Slurm has powered down is terminated at the second check in
    a row, never the first; a node drained by its own health is powered down; a node running a
    job is left; no answer from sinfo judges nothing."""
    import os
    import sys

    from gpuprov.slurm import power_aws_node

    path, log = fixture_scontrol(tmp_path)
    states = tmp_path / "sinfo.txt"
    sinfo = Path(path.split(os.pathsep)[0]) / "sinfo"
    sinfo.write_text(f"#!{sys.executable}\nimport sys\ntext = open({str(states)!r}).read()\n"
                     "sys.exit(1) if text == 'fail' else print(text, end='')\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", path)
    config = {"cluster": CLUSTER, "launch_template": plan.launch_template, "image": plan.image,
              "instance_type": ITYPE, "subnets": list(plan.subnets.items()), "rests": str(tmp_path / "rests.json")}
    actions = power_aws_node.Actions(config, ec2)
    for i in (1, 2, 3):
        assert isinstance(power.resume(ec2, plan, f"{CLUSTER}-dy-{i}", actions.rests, 1000.0, f"t{i}"), power.Started)
    states.write_text(f"{CLUSTER}-node-1|idle|none\n{CLUSTER}-dy-1|idle~|none\n"
                      f"{CLUSTER}-dy-2|drained|gpuprov health: gpu_count: 7 of 8\n{CLUSTER}-dy-3|allocated|none\n")
    suspects = actions.check(set())
    assert suspects == {f"{CLUSTER}-dy-1"} and len(power.running(ec2, CLUSTER)) == 3
    assert json.loads(log.read_text()) == ["update", f"NodeName={CLUSTER}-dy-2", "State=POWER_DOWN_FORCE"]
    states.write_text("fail")
    assert actions.check(suspects) == suspects and len(power.running(ec2, CLUSTER)) == 3
    states.write_text(f"{CLUSTER}-dy-1|idle~|none\n{CLUSTER}-dy-2|idle%|none\n{CLUSTER}-dy-3|allocated|none\n")
    assert actions.check(suspects) == set()
    assert sorted(power.running(ec2, CLUSTER)) == [f"{CLUSTER}-dy-2", f"{CLUSTER}-dy-3"]
    assert f"orphan {CLUSTER}-dy-1: running while Slurm has it idle~; terminated i-" in capsys.readouterr().out


def test_a_spot_interrupted_dynamic_node_is_powered_down_once_its_jobs_are_requeued_and_its_instance_goes(
        ec2, shim, plan, tmp_path, monkeypatch, capsys) -> None:
    """The spot watcher on a dynamic node drained it on EC2's interruption notice (Reason `spot
    interruption at TIME`, tests/e2e/test_slurm_e2e.py proves the watcher's drain, signal and
    requeue) and its job was requeued: the service's check powers it down (FIXTURE sinfo and
    scontrol, as above), and the suspend slurmctld then sends terminates its instance, before
    EC2 takes it; a node still draining (its job within the watcher's grace) is left."""
    import os
    import sys

    from gpuprov.slurm import power_aws_node

    path, log = fixture_scontrol(tmp_path)
    states = tmp_path / "sinfo.txt"
    sinfo = Path(path.split(os.pathsep)[0]) / "sinfo"
    sinfo.write_text(f"#!{sys.executable}\nprint(open({str(states)!r}).read(), end='')\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("PATH", path)
    config = {"cluster": CLUSTER, "launch_template": plan.launch_template, "image": plan.image,
              "instance_type": ITYPE, "subnets": list(plan.subnets.items()), "rests": str(tmp_path / "rests.json")}
    actions = power_aws_node.Actions(config, ec2)
    for i in (1, 2):
        assert isinstance(power.resume(ec2, plan, f"{CLUSTER}-dy-{i}", actions.rests, 1000.0, f"t{i}"), power.Started)
    states.write_text(f"{CLUSTER}-dy-1|drained|spot interruption at 2026-12-07T23:30:00Z\n"
                      f"{CLUSTER}-dy-2|draining|spot interruption at 2026-12-07T23:30:00Z\n")
    actions.check(set())
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        ["update", f"NodeName={CLUSTER}-dy-1", "State=POWER_DOWN_FORCE"]]
    said = capsys.readouterr().out
    assert (f"spot {CLUSTER}-dy-1: spot interruption at 2026-12-07T23:30:00Z, its jobs requeued or ended; "
            "powered down (its instance terminated)") in said, said
    actions("suspend", (f"{CLUSTER}-dy-1",))  # slurmctld's SuspendProgram, once the node is powered down
    assert sorted(power.running(ec2, CLUSTER)) == [f"{CLUSTER}-dy-2"]


def test_the_policy_grants_what_the_service_calls_and_nothing_more(ec2, shim, plan) -> None:
    """The actions of docs/aws-iam-policy-power.json are exactly those the service's calls need
    (a resume, a zone refused, the running list, a suspend): none missing, none to spare."""
    shim.faults.append(Fault("RunInstances", "InsufficientInstanceCapacity", zone=next(iter(plan.subnets)), times=1))
    rests = power.Rests()
    assert isinstance(power.resume(ec2, plan, f"{CLUSTER}-dy-1", rests, now=1000.0, token="t1"), power.Started)
    power.running(ec2, CLUSTER)
    power.suspend(ec2, CLUSTER, [f"{CLUSTER}-dy-1"])
    called = {f"ec2:{c.action}" for c in shim.calls if c.service == "ec2"}
    # RunInstances with tags asks ec2:CreateTags too (tests/aws/iam.py's authorizations)
    needed = called | {a.action for c in iam.mutating(shim.calls) for a in iam.authorizations(c, CLUSTER)}
    granted = {a for st in POLICY["Statement"] for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    assert granted == needed, (sorted(granted - needed), sorted(needed - granted))


def test_the_service_runs_from_its_zipapp_as_the_controllers_unit_runs_it(ec2, shim, plan, tmp_path) -> None:
    """`python3 -I power-aws.pyz CONFIG`, as the controller's unit runs it: it listens, a resume
    from the real power program launches the node, SIGTERM stops it (exit 0)."""
    import signal
    import subprocess
    import sys

    from gpuprov.slurm import power_aws_bundle

    pyz = power_aws_bundle.write(tmp_path)
    key = tmp_path / "power.key"
    key.write_bytes(b"k" * 32)
    config = _service_config(plan, tmp_path, key, count=2)
    service = subprocess.Popen([sys.executable, "-I", str(pyz), str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        first = service.stdout.readline()
        assert " listening on http://127.0.0.1:" in first, first
        url = first.split(" listening on ", 1)[1].split()[0]
        link = tmp_path / "gpuprov-slurm-resume"
        link.symlink_to(ROOT / "roles" / "slurm" / "files" / "gpuprov-slurm-power")
        (tmp_path / "gpuprov-power.json").write_text(json.dumps({"url": url, "key_file": str(key)}))
        sent = subprocess.run([sys.executable, str(link), "--config", str(tmp_path / "gpuprov-power.json"),
                               f"{CLUSTER}-dy-2"], capture_output=True, text=True, timeout=60, check=False)
        assert sent.returncode == 0, sent.stderr
        assert service.stdout.readline() == f"resume {CLUSTER}-dy-2: taken\n"  # the HTTP side's line
        said = service.stdout.readline()
        assert said.startswith(f"resume {CLUSTER}-dy-2: i-"), said
        assert list(power.running(ec2, CLUSTER)) == [f"{CLUSTER}-dy-2"]
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=30) == 0


def test_a_resume_ec2_refuses_for_another_reason_sets_the_node_down_with_its_code(ec2, shim, plan, tmp_path,
                                                                                  monkeypatch) -> None:
    """Not capacity (a quota, a permission, no credentials yet): the node is set DOWN at once with
    EC2's code, so Slurm requeues its job, and the next node is still tried."""
    from gpuprov.slurm import power_aws_node

    path, log = fixture_scontrol(tmp_path)
    monkeypatch.setenv("PATH", path)
    config = {"cluster": CLUSTER, "launch_template": plan.launch_template, "image": plan.image,
              "instance_type": ITYPE, "subnets": list(plan.subnets.items()), "rests": str(tmp_path / "rests.json")}
    shim.faults.append(Fault("RunInstances", "UnauthorizedOperation", message="not allowed\nhere", times=1))
    power_aws_node.Actions(config, ec2)("resume", (f"{CLUSTER}-dy-1", f"{CLUSTER}-dy-2"))
    (down,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert down == ["update", f"NodeName={CLUSTER}-dy-1", "State=DOWN",
                    "Reason=gpuprov: resume failed: UnauthorizedOperation: not allowed here"], down
    assert list(power.running(ec2, CLUSTER)) == [f"{CLUSTER}-dy-2"]
