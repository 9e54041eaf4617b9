"""`up --provider aws --os debian13`: Debian 13's official image through the public SSM parameter
Debian's cloud team publishes for trixie (/aws/service/debian/release/13/latest/<arch>), else the
newest image of Debian's account named debian-13-<arch>-*; and the lock's OS refuses, before anything
is asked of AWS, a package source it has no package names of (NVIDIA's debian13 repository).

Against moto behind the shim, as tests/aws/test_default_image.py does for Debian 12 (the shim's call
log is the witness of which parameter was read); the fallback by owner through botocore's Stubber,
since moto holds no image of Debian's account.
"""

from __future__ import annotations

import json

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.lock.stack_choice import StackChoice
from gpuprov.providers import ClusterSpec
from gpuprov.providers.aws import preflight
from gpuprov.providers.aws.options import AwsOptions
from tests.aws.helpers import CIDR, assert_refused, invoke
from tests.aws.images import DEBIAN, OTHER_X86_AMI, ami_image, asked, fallback
from tests.aws.moto_shim import Shim

TRIXIE = "/aws/service/debian/release/13/latest/amd64"


def _dry(capsys, name: str, *extra: str) -> tuple[int, str, str]:
    return invoke(capsys, "up", "--name", name, "--type", "g5.xlarge", "--count", "1", "--ssh-cidr", CIDR,
                  "--dry-run", "--os", "debian13", *extra)


def test_os_debian13_reads_trixies_parameter_and_says_what_is_proven(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = OTHER_X86_AMI
    shim.ssm_parameters[TRIXIE] = ami
    code, _, err = _dry(capsys, "trixie", "--source", "distro")
    assert code == 0, err
    assert asked(shim) == [TRIXIE]
    assert (f"image {ami}: Debian 13 (trixie), --os debian13 (proven here on the emulated EC2 "
            "(tests/aws/test_debian13_ec2.py): the launch, its user-data under trixie's cloud-init, the host-key "
            "hand-over and the microcode and spot plays; its driver and cuda plays on local nodes), from SSM "
            f"{TRIXIE}") in err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == ami


@pytest.mark.parametrize("source", [None, "nvidia", "mirror"])
def test_os_debian13_without_package_names_of_the_source_is_refused_before_aws(capsys, shim: Shim,
                                                                               source: str | None) -> None:
    shim.ssm_parameters[TRIXIE] = OTHER_X86_AMI
    extra = ("--source", source) if source else ()
    if source == "mirror":
        extra += ("--mirror-url", "http://192.0.2.1/repo", "--mirror-key-fingerprint", "A" * 40)
    code, out, err = _dry(capsys, f"trixie-{source or 'default'}", *extra)
    assert_refused(code, out, err, f"--os debian13 with package source '{source or 'nvidia'}': ", shim)
    assert "use --source distro" in err
    assert shim.calls == []


def test_a_trixie_cluster_records_the_image_and_a_debian13_lock(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[TRIXIE] = ami
    code, _, err = invoke(capsys, "up", "--name", "trixie-up", "--type", "g5.xlarge", "--count", "1",
                          "--ssh-cidr", CIDR, "--os", "debian13", "--source", "distro", "--no-bootstrap", "--yes")
    assert code == 0, err
    assert [c.params["ImageId"] for c in shim.run_calls()] == [ami]
    code, out, err = invoke(capsys, "status", "trixie-up", "-o", "json")
    assert code == 0, err
    status = json.loads(out)
    assert status["spec"]["options"]["os"] == "debian13"
    lock = status["stack"]
    assert (lock["os"], lock["source"], lock["driver"], lock["cuda"], lock["kernel_module"]) == (
        "debian13", "distro", "550.163.01", "12.4", "proprietary")  # trixie's open module does not build
    assert lock["packages"]["driver"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"]


def test_trixie_fallback_asks_debians_account_for_debian_13_images(stubbed) -> None:
    aws, stubs = stubbed
    fallback(stubs, TRIXIE, "136693071363", "debian-13-amd64-*", "x86_64", [
        ami_image("ami-0000000000000000a", "debian-13-amd64-20251001-2200", "2025-10-01T22:00:00.000Z"),
        ami_image("ami-0000000000000000e", "debian-13-amd64-20251110-2300", "2025-11-10T23:00:00.000Z"),
    ])
    notes: list[str] = []
    spec = preflight.check_spec(ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1,
                                            options=AwsOptions(os="debian13"), stack=StackChoice(source="distro")))
    image = preflight.find_image(aws, spec, catalog.get("g5.xlarge"), [], notes)
    assert (image.id, image.os) == ("ami-0000000000000000e", "debian13")
    assert image.what.startswith("Debian 13 (trixie), --os debian13 (proven here on the emulated EC2")
    assert notes == [f"warning: SSM parameter {TRIXIE} unreadable (AccessDeniedException); took owner "
                     "136693071363's newest image named debian-13-amd64-*"]


def test_check_spec_refuses_a_source_the_os_has_no_names_of() -> None:
    spec = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1, options=AwsOptions(os="debian13"))
    with pytest.raises(BadInput, match=r"^--os debian13 with package source 'nvidia': gpuprov has not read"):
        preflight.check_spec(spec)
    distro = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1,
                         options=AwsOptions(os="debian13"), stack=StackChoice(source="distro"))
    assert preflight.check_spec(distro).options.os == "debian13"
