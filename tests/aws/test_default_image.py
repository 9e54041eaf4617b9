"""The image `up` launches on EC2: Debian 12 by default (the OS this suite proves), Ubuntu
22.04 or 24.04 with --os (Canonical's public parameters), --image over both, the members' image for a cluster that already runs, and
always the type's own CPU architecture.

Against moto behind the shim (its call log is the witness of what was asked), and, for the
publisher's-newest fallback moto cannot hold (it has no image of Debian's account), against
botocore's Stubber, which checks every request against the service model.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from gpuprov import catalog
from gpuprov.cli import options as cli_options
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec
from gpuprov.providers.aws import preflight
from gpuprov.providers.aws.options import AwsOptions
from tests.aws.conftest import REGION
from tests.aws.helpers import CIDR, assert_refused, invoke
from tests.aws.images import ARM_AMI, DEBIAN, DEBIAN_ARM, OTHER_X86_AMI, UBUNTU, ami_image, asked, fallback
from tests.aws.moto_shim import Shim

# Canonical's public parameter for Ubuntu 24.04 (noble), gp3 (gpuprov/providers/aws/preflight.py).
NOBLE = "/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"


def _dry(capsys, name: str, *extra: str) -> tuple[int, str, str]:
    return invoke(capsys, "up", "--name", name, "--type", "g5.xlarge", "--count", "1", "--ssh-cidr", CIDR,
                  "--dry-run", *extra)


# -- which parameter is read ------------------------------------------------------------------
def test_the_default_is_debian_12_from_its_public_parameter(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = ami
    shim.ssm_parameters[UBUNTU] = OTHER_X86_AMI
    code, _, err = _dry(capsys, "deb")
    assert code == 0, err
    assert asked(shim) == [DEBIAN]
    assert (f"image {ami}: Debian 12 (bookworm), the default (proven here), from SSM {DEBIAN}; "
            "root volume 200 GiB gp3, encrypted") in err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == ami


@pytest.mark.parametrize(("os_name", "title", "other"), [
    ("ubuntu22.04", "Ubuntu 22.04 (jammy)", False), ("ubuntu24.04", "Ubuntu 24.04 (noble)", True)])
def test_os_ubuntu_reads_canonicals_parameter_and_says_it_is_not_proven(capsys, shim: Shim, ami: str, os_name: str,
                                                                         title: str, other: bool) -> None:
    """Each Ubuntu reads its own Canonical parameter (22.04 on gp2, 24.04 on gp3), never another's."""
    mine, theirs = (NOBLE, UBUNTU) if other else (UBUNTU, DEBIAN)
    shim.ssm_parameters[theirs] = OTHER_X86_AMI
    shim.ssm_parameters[mine] = ami
    code, _, err = _dry(capsys, os_name.replace(".", ""), "--os", os_name)
    assert code == 0, err
    assert asked(shim) == [mine]
    assert (f"image {ami}: {title}, --os {os_name} (not proven here: gpuprov's suite "
            f"runs Debian 12), from SSM {mine}") in err
    (run,) = [c for c in shim.calls if c.action == "RunInstances" and c.dry_run]
    assert run.params["ImageId"] == ami


def test_os_ubuntu2404_with_the_distro_source_is_refused_before_aws(capsys, shim: Shim) -> None:
    shim.ssm_parameters[NOBLE] = OTHER_X86_AMI
    code, out, err = _dry(capsys, "noble-distro", "--os", "ubuntu24.04", "--source", "distro")
    assert_refused(code, out, err, "--os ubuntu24.04 with package source 'distro': gpuprov reads no Ubuntu "
                   "archive here", shim)
    assert shim.calls == []


def test_a_noble_cluster_records_the_image_and_an_ubuntu2404_lock(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[NOBLE] = ami
    code, _, err = invoke(capsys, "up", "--name", "noble-up", "--type", "g5.xlarge", "--count", "1",
                          "--ssh-cidr", CIDR, "--os", "ubuntu24.04", "--no-bootstrap", "--yes")
    assert code == 0, err
    assert [c.params["ImageId"] for c in shim.run_calls()] == [ami]
    code, out, err = invoke(capsys, "status", "noble-up", "-o", "json")
    assert code == 0, err
    status = json.loads(out)
    assert status["spec"]["options"]["os"] == "ubuntu24.04"
    lock = status["stack"]
    assert (lock["os"], lock["source"], lock["driver"], lock["cuda"], lock["kernel_module"]) == (
        "ubuntu24.04", "nvidia", "580.159.04", "12.9", "open")
    assert lock["packages"]["driver"] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]
    assert lock["packages"]["fabricmanager"] == "nvidia-fabricmanager"


def test_image_wins_over_os_and_no_parameter_is_read(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = OTHER_X86_AMI
    shim.ssm_parameters[UBUNTU] = OTHER_X86_AMI
    code, _, err = _dry(capsys, "given", "--image", ami, "--os", "ubuntu22.04")
    assert code == 0, err
    assert asked(shim) == []
    assert f"image {ami}: --image (wins over --os ubuntu22.04), Windows_Server-2016" in err


# -- a parameter that is not there, or names the wrong thing ---------------------------------------
def test_missing_parameter_falls_back_to_debians_images_and_says_what_failed(capsys, shim: Shim) -> None:
    code, out, err = _dry(capsys, "none")
    assert_refused(code, out, err, f"no Debian 12 (bookworm) amd64 image found in {REGION}: SSM parameter "
                   f"{DEBIAN} unreadable (ParameterNotFound) and no image of owner 136693071363 named "
                   "debian-12-amd64-*; pass --image ami-... (or another --os: debian13, ubuntu22.04, ubuntu24.04)", shim)
    # (the first DescribeImages by owner is the look-up of an image baked for the lock: none)
    baked, listed = [c.params for c in shim.calls if c.action == "DescribeImages" and "Owner.1" in c.params]
    assert baked["Owner.1"] == "self" and baked["Filter.1.Name"] == "tag-key"
    filters = {listed[f"Filter.{i}.Name"]: listed[f"Filter.{i}.Value.1"] for i in (1, 2, 3)}
    assert listed["Owner.1"] == "136693071363"
    assert filters == {"name": "debian-12-amd64-*", "architecture": "x86_64", "state": "available"}


def test_a_parameter_naming_an_arm64_image_is_not_used_for_an_x86_64_type(capsys, shim: Shim) -> None:
    shim.ssm_parameters[DEBIAN] = ARM_AMI
    code, out, err = _dry(capsys, "armimg")
    assert_refused(code, out, err, f"SSM parameter {DEBIAN} unreadable (it names an arm64 image)", shim)
    assert not [c for c in shim.calls if c.action == "RunInstances"]


def test_an_image_of_another_architecture_is_refused(capsys, shim: Shim) -> None:
    code, out, err = _dry(capsys, "armgiven", "--image", ARM_AMI)
    assert_refused(code, out, err, f"--image {ARM_AMI} is an arm64 image but g5.xlarge runs x86_64", shim)


# -- what the cluster records, and what it grows with ---------------------------------------------
def test_the_os_is_recorded_and_a_growing_cluster_keeps_its_image(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = ami
    base = ("up", "--name", "grow", "--type", "g5.xlarge", "--ssh-cidr", CIDR, "--no-bootstrap", "--yes")
    code, _, err = invoke(capsys, *base, "--count", "1")
    assert code == 0, err
    code, out, err = invoke(capsys, "status", "grow", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["spec"]["options"]["os"] == "debian12"

    # Debian publishes a newer image: the members' one still serves the cluster.
    shim.ssm_parameters[DEBIAN] = OTHER_X86_AMI
    shim.calls.clear()
    code, _, err = invoke(capsys, *base, "--count", "2")
    assert code == 0, err
    assert f"image {ami}: the image the 1 existing member(s) run" in err
    assert [c.params["ImageId"] for c in shim.run_calls()] == [ami]
    assert asked(shim) == []


# -- --os on the command line ---------------------------------------------------------------------
def test_os_choices_are_the_images_the_provider_has() -> None:
    (option,) = [o for o in _options() if o.name == "os_name"]
    assert tuple(option.type.choices) == preflight.OS_CHOICES
    assert preflight.DEFAULT_OS == "debian12"


def _options() -> list[Any]:
    import click

    @click.command()
    def probe(**_: Any) -> None: ...

    for option in cli_options.UP_OPTIONS:
        option(probe)
    return list(probe.params)


def test_unknown_os_is_one_line_exit_2(capsys, shim: Shim) -> None:
    code, out, err = _dry(capsys, "bados", "--os", "centos7")
    assert_refused(code, out, err, "'centos7' is not one of 'debian12', 'debian13', 'ubuntu22.04', 'ubuntu24.04'", shim)
    assert shim.calls == []


@pytest.mark.parametrize(("os_name", "extra"), [("ubuntu22.04", ()), ("ubuntu24.04", ("--no-bootstrap",))])
def test_os_elsewhere_is_each_providers_own(capsys, gpuprov_home, tmp_path, os_name: str, extra: tuple) -> None:
    """docker has node images of Debian 12 and 13 only (one line, exit 2); static takes --os as a
    claim, checked against the hosts' /etc/os-release once they answer (tests/cli/test_up_os_cli.py).
    (Ubuntu 24.04 with a bootstrap is refused earlier, for its CUDA line: test_stack_ubuntu.py.)"""
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--os", os_name, "--count", "1", *extra)
    assert code == 2, err
    assert out == "" and err.strip() == (f"gpuprov: --os {os_name}: local nodes run debian12 or debian13 "
                                         "(node images gpuprov/node:bookworm, gpuprov/node:trixie)")
    (tmp_path / "hosts.yml").write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    code, _, err = invoke(capsys, "up", "--provider", "static", "--os", os_name, "--hosts",
                          str(tmp_path / "hosts.yml"), "--dry-run")
    assert code == 0, err


def test_check_spec_fills_the_default_only_without_an_image() -> None:
    spec = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1, options=AwsOptions())
    assert preflight.check_spec(spec).options.os == "debian12"
    given = spec.with_options(image="ami-0123456789abcdef0")
    assert preflight.check_spec(given).options.os is None
    with pytest.raises(BadInput, match=r"--os centos7: gpuprov has images for debian12, debian13, ubuntu22\.04, ubuntu24\.04$"):
        preflight.check_spec(spec.with_options(os="centos7"))


# -- the publisher's newest image, and the architecture, through the Stubber ------------------------
def test_unreadable_parameter_takes_the_publishers_newest_image(stubbed) -> None:
    aws, stubs = stubbed
    fallback(stubs, DEBIAN, "136693071363", "debian-12-amd64-*", "x86_64", [
        ami_image("ami-0000000000000000a", "debian-12-amd64-20250101-1000", "2025-01-01T10:00:00.000Z"),
        ami_image("ami-0000000000000000c", "debian-12-amd64-20250301-1200", "2025-03-01T12:00:00.000Z"),
        ami_image("ami-0000000000000000b", "debian-12-amd64-20250201-1100", "2025-02-01T11:00:00.000Z"),
    ])
    notes: list[str] = []
    spec = preflight.check_spec(ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1, options=AwsOptions()))
    image = preflight.find_image(aws, spec, catalog.get("g5.xlarge"), [], notes)
    assert (image.id, image.root_device, image.os) == ("ami-0000000000000000c", "/dev/xvda", "debian12")
    assert image.what == "Debian 12 (bookworm), the default (proven here), debian-12-amd64-20250301-1200"
    assert notes == [f"warning: SSM parameter {DEBIAN} unreadable (AccessDeniedException); took owner "
                     "136693071363's newest image named debian-12-amd64-*"]


def test_ubuntu_fallback_asks_canonical(stubbed) -> None:
    aws, stubs = stubbed
    fallback(stubs, UBUNTU, "099720109477", "ubuntu/images/hvm-ssd*/ubuntu-jammy-22.04-amd64-server-*",
              "x86_64", [ami_image("ami-0000000000000000d", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-"
                                "server-20250301", "2025-03-01T00:00:00.000Z")])
    spec = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1,
                       options=AwsOptions(os="ubuntu22.04"))
    image = preflight.find_image(aws, spec, catalog.get("g5.xlarge"), [], [])
    assert (image.id, image.os) == ("ami-0000000000000000d", "ubuntu22.04")


def test_noble_fallback_asks_canonical_for_its_newest_noble_image(stubbed) -> None:
    aws, stubs = stubbed
    fallback(stubs, NOBLE, "099720109477", "ubuntu/images/hvm-ssd*/ubuntu-noble-24.04-amd64-server-*", "x86_64", [
        ami_image("ami-0000000000000000a", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250101",
                  "2025-01-01T00:00:00.000Z"),
        ami_image("ami-0000000000000000e", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20251101",
                  "2025-11-01T00:00:00.000Z")])
    spec = ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1,
                       options=AwsOptions(os="ubuntu24.04"))
    notes: list[str] = []
    image = preflight.find_image(aws, spec, catalog.get("g5.xlarge"), [], notes)
    assert (image.id, image.os) == ("ami-0000000000000000e", "ubuntu24.04")
    assert image.what == ("Ubuntu 24.04 (noble), --os ubuntu24.04 (not proven here: gpuprov's suite runs Debian 12), "
                          "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20251101")
    assert notes == [f"warning: SSM parameter {NOBLE} unreadable (AccessDeniedException); took owner "
                     "099720109477's newest image named ubuntu/images/hvm-ssd*/ubuntu-noble-24.04-amd64-server-*"]


def test_an_arm64_type_asks_only_for_arm64_images(stubbed) -> None:
    """gpuprov refuses arm64 types when it resolves the lock (x86_64 packages only); until then no
    amd64 parameter or image is ever asked for one, and what comes back is checked."""
    aws, stubs = stubbed
    arm = dataclasses.replace(catalog.get("g5.xlarge"), name="g5g.xlarge", cpu_arch="arm64")
    stubs["ssm"].add_response("get_parameter", {"Parameter": {"Name": DEBIAN_ARM, "Value": "ami-0000000000000000e"}},
                              expected_params={"Name": DEBIAN_ARM})
    stubs["ec2"].add_response("describe_images", {"Images": [
        ami_image("ami-0000000000000000e", "debian-12-arm64-20250301-1200", "2025-03-01T00:00:00.000Z", "arm64")]},
        expected_params={"ImageIds": ["ami-0000000000000000e"]})
    spec = preflight.check_spec(ClusterSpec(name="c", provider="aws", instance_type="g5g.xlarge", count=1, options=AwsOptions()))
    image = preflight.find_image(aws, spec, arm, [], [])
    assert image.id == "ami-0000000000000000e"
    assert image.what.endswith(f"from SSM {DEBIAN_ARM}")

    # An amd64 image under the arm64 name is not taken: the arm64 fallback is asked instead.
    stubs["ssm"].add_response("get_parameter", {"Parameter": {"Name": DEBIAN_ARM, "Value": "ami-0000000000000000f"}},
                              expected_params={"Name": DEBIAN_ARM})
    stubs["ec2"].add_response("describe_images", {"Images": [
        ami_image("ami-0000000000000000f", "debian-12-amd64-20250301-1200", "2025-03-01T00:00:00.000Z")]},
        expected_params={"ImageIds": ["ami-0000000000000000f"]})
    stubs["ec2"].add_response("describe_images", {"Images": []}, expected_params={
        "Owners": ["136693071363"],
        "Filters": [{"Name": "name", "Values": ["debian-12-arm64-*"]}, {"Name": "architecture", "Values": ["arm64"]},
                    {"Name": "state", "Values": ["available"]}]})
    with pytest.raises(BadInput, match=r"no Debian 12 \(bookworm\) arm64 image found .*it names an x86_64 image"):
        preflight.find_image(aws, spec, arm, [], [])


# -- the IAM policy lets gpuprov read exactly these parameters ---------------------------------------
@pytest.mark.parametrize("chosen", preflight.OS_CHOICES)
@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_the_iam_policy_allows_reading_each_image_parameter(chosen: str, arch: str) -> None:
    from tests.aws import iam
    from tests.aws.conftest import ROOT_POLICY

    policy = json.loads(ROOT_POLICY.read_text())
    name = preflight.IMAGE_SOURCES[chosen][0].format(arch=arch)
    assert iam.allowed_by(policy, iam.Authorization("ssm:GetParameter", f"arn:aws:ssm:{REGION}::parameter{name}"))
    other = "/aws/service/debian/release/11/latest/amd64"
    assert not iam.allowed_by(policy, iam.Authorization("ssm:GetParameter", f"arn:aws:ssm:{REGION}::parameter{other}"))
