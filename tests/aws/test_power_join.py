"""A dynamic node's join on the emulated EC2 with a real node (gpuprov.providers.aws.power_boot
through the controller's service, issue 56): the power service launches the node with its own
user-data, the instance (a systemd node container booting that user-data with cloud-init,
tests/aws/ec2_nodes.py) comes up with its Slurm name and the host key made for it, the service
logs in with its own key, checked strictly against that pinned key, and runs the hand-over as
root; the node's script refuses an image that is not a Slurm node's (this one is a plain cloud
image), so the service sets the node DOWN with why and terminates it. What a Slurm node's image
does with the hand-over (munge and slurmd started from the controller's configuration) needs a
controller: not proven here yet (docs/slurm.md, "Not built yet")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuprov.providers.aws import power
from tests.aws.conftest import MOTO_AMI, REGION
from tests.aws.helpers import fixture_scontrol

pytestmark = pytest.mark.e2e
CLUSTER = "train"


@pytest.fixture
def client(shim) -> Any:
    import boto3

    return boto3.client("ec2", region_name=REGION)


def test_a_launched_node_boots_its_user_data_answers_its_pinned_key_and_a_plain_image_is_refused(
        shim, ec2, client, tmp_path, monkeypatch, capsys) -> None:
    from gpuprov.slurm import power_aws_node

    ec2.private_on_loopback = True  # the controller reaches a node at its private address
    path, log = fixture_scontrol(tmp_path)
    monkeypatch.setenv("PATH", path)
    template = client.create_launch_template(
        LaunchTemplateName=f"gpuprov-{CLUSTER}-dynamic",
        LaunchTemplateData={"InstanceType": "t3.micro", "MetadataOptions": {"HttpTokens": "required"}},
    )["LaunchTemplate"]["LaunchTemplateId"]
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in client.describe_subnets()["Subnets"] if s["DefaultForAz"]}
    zone = sorted(subnets)[0]
    munge = tmp_path / "munge.key"
    munge.write_bytes(b"m" * 1024)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = {"cluster": CLUSTER, "launch_template": template, "image": MOTO_AMI, "instance_type": "t3.micro",
              "subnets": [[zone, subnets[zone]]], "rests": str(state / "rests.json"),
              "join": {"controller_addr": "10.0.0.5", "munge_key": str(munge), "deadline_s": 300}}
    actions = power_aws_node.Actions(config, client)
    actions("resume", (f"{CLUSTER}-dy-1",))
    (run,) = shim.run_calls()
    user_data = run.params.get("UserData", "")
    assert user_data, "the resume gave the node no user-data of its own"
    assert actions.wait_joins(360), "the join did not end"
    said = capsys.readouterr().out
    assert (f"join {CLUSTER}-dy-1: join: slurmd is not installed: the image is not one baked from a node of "
            "the Slurm cluster (exit 4); set DOWN; terminated i-") in said, said
    (down,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert down[:3] == ["update", f"NodeName={CLUSTER}-dy-1", "State=DOWN"], down
    assert down[3].startswith("Reason=gpuprov: resume failed: join: slurmd is not installed"), down
    assert power.running(client, CLUSTER) == {} and ec2.containers() == []
    # Nothing of the hand-over reached the node before its image was checked, and the service's
    # state holds its own login key and no node's key.
    assert sorted(p.name for p in state.iterdir()) == ["login_ed25519", "login_ed25519.pub"]
