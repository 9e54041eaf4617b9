"""Shared by the tests of the image `up` launches on EC2 (test_default_image.py,
test_debian13_image.py): the public SSM parameters, moto's bundled images, what the shim saw
asked, and the publisher's-newest fallback as botocore's Stubber answers it (its fixture,
``stubbed``, is in conftest.py)."""

from __future__ import annotations

from typing import Any

from tests.aws.moto_shim import Shim

DEBIAN = "/aws/service/debian/release/12/latest/amd64"
DEBIAN_ARM = "/aws/service/debian/release/12/latest/arm64"
UBUNTU = "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
OTHER_X86_AMI = "ami-12c6146b"  # another x86_64 image moto bundles
ARM_AMI = "ami-0e9271c829888680e"  # the arm64 image moto bundles


def asked(shim: Shim, action: str = "GetParameter") -> list[str]:
    """The SSM parameter names the shim saw asked for."""
    return [c.params.get("Name", "") for c in shim.calls if c.service == "ssm" and c.action == action]


def ami_image(image_id: str, name: str, created: str, arch: str = "x86_64") -> dict[str, Any]:
    return {"ImageId": image_id, "Name": name, "CreationDate": created, "Architecture": arch,
            "RootDeviceName": "/dev/xvda", "State": "available"}


def fallback(stubs: dict[str, Any], parameter: str, owner: str, pattern: str, arch: str,
              images: list[dict[str, Any]]) -> None:
    stubs["ssm"].add_client_error("get_parameter", "AccessDeniedException", "not allowed",
                                  expected_params={"Name": parameter})
    stubs["ec2"].add_response("describe_images", {"Images": images}, expected_params={
        "Owners": [owner],
        "Filters": [{"Name": "name", "Values": [pattern]}, {"Name": "architecture", "Values": [arch]},
                    {"Name": "state", "Values": ["available"]}]})


def baked_ami(source_ami: str, lock_hash: str, *, os: str = "debian12", at: str = "2026-11-25T10:00:00Z",
              slurm: bool = False) -> str:
    """An AMI as gpuprov's bake leaves it: captured from an instance, tagged with the lock
    (``slurm``: and as a Slurm cluster's node's, gpuprov.providers.aws.images.SLURM_TAG)."""
    import boto3

    from gpuprov.images import LOCK_FIELDS
    from tests.aws.conftest import REGION

    ec2 = boto3.client("ec2", region_name=REGION)
    iid = ec2.run_instances(ImageId=source_ami, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][0][
        "InstanceId"]
    tags = [{"Key": "gpuprov:lock", "Value": lock_hash}, {"Key": "gpuprov:baked-at", "Value": at},
            {"Key": "gpuprov:baked-from", "Value": "src/src-node-1"}, {"Key": "gpuprov:os", "Value": os},
            *({"Key": f"gpuprov:lock.{k}", "Value": "x"} for k in LOCK_FIELDS),
            *([{"Key": "gpuprov:slurm", "Value": "yes"}] if slurm else [])]
    image = ec2.create_image(InstanceId=iid, Name=f"gpuprov-{lock_hash}-{at.replace(':', '')}",
                             TagSpecifications=[{"ResourceType": "image", "Tags": tags}])["ImageId"]
    ec2.terminate_instances(InstanceIds=[iid])
    return str(image)
