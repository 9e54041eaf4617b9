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
