"""Baked AMIs on EC2 (moto's server behind the test shim): which image `up` boots new nodes
from, `image list`, `image delete`, and the flags' checks.

The AMIs here are made the way gpuprov's bake leaves them (CreateImage from an instance,
tagged with the lock; see gpuprov/providers/aws/images.py), by boto3 straight: the bake
itself, with its clean-up over SSH, runs on a real node in tests/aws/test_ec2_headline.py.
"""

from __future__ import annotations

import json
import re

import boto3

from tests.aws.conftest import REGION
from tests.aws.helpers import CIDR, invoke
from tests.aws.images import baked_ami
from tests.aws.moto_shim import Shim

DEBIAN = "/aws/service/debian/release/12/latest/amd64"


def _dry(capsys, name: str, *extra: str) -> tuple[int, str, str]:
    return invoke(capsys, "up", "--name", name, "--type", "g5.xlarge", "--count", "1", "--ssh-cidr", CIDR,
                  "--dry-run", *extra)


def _lock_of(capsys, shim: Shim, ami: str, *extra: str) -> str:
    """The lock hash `up` resolves for a g5.xlarge (from its dry run's plan)."""
    code, _, err = _dry(capsys, "probe", "--image", ami, *extra)
    assert code == 0, err
    # An --image is described by the plan; no listing of baked AMIs is asked for it.
    assert not [c for c in shim.calls if c.action == "DescribeImages" and c.params.get("Owner.1") == "self"]
    shim.calls.clear()
    return re.search(r"\[lock ([0-9a-f]{12})\]", err).group(1)


def test_up_boots_from_the_newest_ami_baked_for_its_lock_and_os(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = ami
    lock = _lock_of(capsys, shim, ami)
    older = baked_ami(ami, lock, at="2026-11-20T10:00:00Z")
    newest = baked_ami(ami, lock, at="2026-11-25T10:00:00Z")
    jammy = baked_ami(ami, lock, os="ubuntu22.04", at="2026-11-26T10:00:00Z")  # newer, but another OS
    baked_ami(ami, "0123456789ab", at="2026-11-27T10:00:00Z")  # newer, but another lock
    shim.calls.clear()
    code, _, err = _dry(capsys, "fast")
    assert code == 0, err
    assert f"image: {newest} (baked for lock {lock} from src/src-node-1, 2026-11-25T10:00:00Z)" in err, err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == newest != older
    # One DescribeImages finds it (this account's images with the lock's tag); the default
    # image's SSM parameter is not read.
    asked = [c for c in shim.calls if c.action == "DescribeImages"]
    assert asked[0].params.get("Owner.1") == "self", asked[0].params
    assert not [c for c in shim.calls if c.service == "ssm"]

    shim.calls.clear()
    code, _, err = _dry(capsys, "slow", "--no-baked")
    assert code == 0, err
    assert "image: the default image (--no-baked: bootstrap from scratch)" in err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == ami
    assert not [c for c in shim.calls if c.action == "DescribeImages" and c.params.get("Owner.1") == "self"]

    # The same lock on the other OS boots that OS's image.
    shim.calls.clear()
    code, _, err = _dry(capsys, "jammy", "--os", "ubuntu22.04")
    assert code == 0, err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == jammy


def test_image_list_and_delete(capsys, shim: Shim, ami: str) -> None:
    lock = _lock_of(capsys, shim, ami)
    image = baked_ami(ami, lock)
    code, out, err = invoke(capsys, "image", "list", "--provider", "aws", "-o", "json")
    assert code == 0, err
    (listed,) = json.loads(out)
    assert listed["ref"] == image and listed["lock_hash"] == lock and listed["provider"] == "aws"
    assert listed["region"] == REGION and listed["os"] == "debian12" and listed["source"] == "src/src-node-1"

    ec2 = boto3.client("ec2", region_name=REGION)
    snapshots = [m["Ebs"]["SnapshotId"] for m in ec2.describe_images(ImageIds=[image])["Images"][0][
        "BlockDeviceMappings"] if m.get("Ebs", {}).get("SnapshotId")]
    user = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][0]
    code, _, err = invoke(capsys, "image", "delete", image, "--provider", "aws", "--yes")
    assert code == 2 and f"{image} is in use by 1 instance(s) ({user['InstanceId']})" in err, err
    assert ec2.describe_images(ImageIds=[image])["Images"]
    ec2.terminate_instances(InstanceIds=[user["InstanceId"]])

    code, _, err = invoke(capsys, "image", "delete", image, "--provider", "aws", "--yes")
    assert code == 0, err
    assert f"deregistered {image}" in err
    assert ec2.describe_images(Owners=["self"])["Images"] == []
    left = ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]
    assert not {s["SnapshotId"] for s in left} & set(snapshots)
    code, _, err = invoke(capsys, "image", "delete", image, "--provider", "aws", "--yes")
    assert code == 2 and f"no baked aws image {image!r}" in err


def test_bad_flags_are_one_line_and_change_nothing(capsys, shim: Shim) -> None:
    for args, needle in (
        (("image", "bake", "--copy-to", "us-west-2"), "--region and --copy-to are for --provider aws"),
        (("image", "bake", "--from", "x", "--type", "g5.xlarge"), "--type and --region go without --from"),
        (("image", "bake", "--from", "x", "--scheduler", "slurm"), "--scheduler goes without --from"),
        (("image", "list", "--region", REGION), "--region is for --provider aws"),
        (("image", "bake", "--from", "nosuch", "--copy-to", "us-west-2"), "nosuch"),
    ):
        code, out, err = invoke(capsys, *args)
        assert code == 2 and out == "", (args, err)
        assert len(err.strip().splitlines()) == 1 and needle in err, (args, err)
    assert shim.mutating() == []


def test_status_flags_nodes_booted_from_an_ami_of_another_lock(capsys, shim: Shim, ami: str) -> None:
    """An AMI baked for another lock, named with --image: `status` reads the AMI's lock tag
    (one DescribeImages) and flags the node; a node of the default image is listed unflagged."""
    lock = _lock_of(capsys, shim, ami)
    other = baked_ami(ami, "0123456789ab")
    common = ("--type", "g5.xlarge", "--count", "1", "--ssh-cidr", CIDR, "--no-bootstrap", "--yes")
    code, _, err = invoke(capsys, "up", "--name", "told", "--image", other, *common)
    assert code == 0, err
    code, out, err = invoke(capsys, "status", "told", "-o", "json")
    assert code == 0, err
    (row,) = json.loads(out)["images"]
    assert (row["image"], row["baked_for"], row["matches_lock"]) == (other, "0123456789ab", False), row
    code, out, _ = invoke(capsys, "status", "told")
    assert f"booted from {other}, baked for lock 0123456789ab, not the cluster's lock {lock}" in out, out
    code, _, err = invoke(capsys, "up", "--name", "plain", "--image", ami, *common)
    assert code == 0, err
    code, out, _ = invoke(capsys, "status", "plain", "-o", "json")
    assert [(r["image"], r["baked_for"], r["matches_lock"]) for r in json.loads(out)["images"]] == [(ami, None, None)]
