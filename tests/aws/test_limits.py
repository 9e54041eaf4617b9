"""What `up` judges before anything exists, and the endpoint/region plumbing.

Finding 10: an unreachable endpoint is one line naming it (exit 1); input that
can be judged without AWS is judged first (exit 2). Finding 11: SSH ranges
wider than an IPv4 /16 or an IPv6 /48 are refused unless asked for; a re-run
replaces the cluster's SSH rule. Finding 12: every limit before anything is
created. Finding 14: the region variables botocore reads, plus AWS_REGION.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles, ClusterSpec
from gpuprov.providers.aws.options import AwsOptions
from tests.aws.conftest import REGION, instances
from tests.aws.helpers import CIDR, assert_refused, invoke
from tests.aws.moto_shim import Shim
from tests.conftest import run_cli

UNREACHABLE = "http://127.0.0.1:9"


def _nothing_tagged(name: str) -> None:
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    tag = [{"Name": "tag:gpuprov:cluster", "Values": [name]}]
    assert ec2.describe_key_pairs(Filters=tag)["KeyPairs"] == []
    assert ec2.describe_security_groups(Filters=tag)["SecurityGroups"] == []
    assert instances(name, ("pending", "running", "terminated", "shutting-down")) == []


# -- finding 10 ------------------------------------------------------------------------------
def test_unreachable_endpoint_is_one_line_naming_it(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", UNREACHABLE)
    monkeypatch.setenv("GPUPROV_AWS_MAX_ATTEMPTS", "2")
    for args in (["up", "--name", "offline", "--type", "g5.xlarge", "--count", "1", "--image", ami,
                  "--ssh-cidr", CIDR, "--yes"],
                 ["down", "offline", "--yes", "--region", REGION]):
        code, _, err = invoke(capsys, *args)
        assert code == 1, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("gpuprov: cannot reach the AWS ec2 endpoint http://127.0.0.1:9"), err
        assert "internal error" not in err
    assert shim.calls == []


def test_input_judged_without_aws_comes_before_the_endpoint(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", UNREACHABLE)
    for bad, needle in ((["--ssh-cidr", "0.0.0.0/1"], "wider than /16"),
                        (["--ssh-cidr", "nonsense"], "not an address range"),
                        (["--ssh-cidr", CIDR, "--count", "400"], "'--count': 400 is not in the range 1<=x<=256")):
        count = [] if "--count" in bad else ["--count", "1"]
        code, _, err = invoke(capsys, "up", "--name", "judged", "--type", "g5.xlarge", *count,
                                "--image", ami, *bad, "--yes")
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert shim.calls == []


# -- finding 11 ------------------------------------------------------------------------------
@pytest.mark.parametrize("cidr", ["0.0.0.0/1", "128.0.0.0/1", "10.0.0.0/8", "198.51.0.0/15", "::/1",
                                  "2000::/3", "2001:db8::/32", "2001:db8::/47"])
def test_wide_ssh_ranges_are_refused(capsys, shim: Shim, ami: str, cidr: str) -> None:
    code, out, err = invoke(capsys, "up", "--name", "wide", "--type", "g5.xlarge", "--count", "1",
                            "--image", ami, "--ssh-cidr", cidr, "--yes")
    assert_refused(code, out, err, f"--ssh-cidr {cidr} opens SSH to", shim)
    assert "--allow-wide-ssh-cidr" in err


@pytest.mark.parametrize("cidr", ["198.51.0.0/16", "2001:db8:1::/48", "2001:db8::1/128"])
def test_ranges_up_to_the_limit_pass(capsys, shim: Shim, ami: str, cidr: str) -> None:
    code, _, err = invoke(capsys, "up", "--name", "narrow", "--type", "g5.xlarge", "--count", "1",
                          "--image", ami, "--ssh-cidr", cidr, "--dry-run")
    assert code == 0, err


def test_allow_wide_ssh_cidr_option_lets_a_wide_range_through(shim: Shim, ami: str, gpuprov_home: Path) -> None:
    from gpuprov.providers.aws import PROVIDER

    files = ClusterFiles(gpuprov_home / "clusters" / "widened")
    spec = ClusterSpec(name="widened", provider="aws", instance_type="g5.xlarge", count=1,
                       options=AwsOptions(image=ami, ssh_cidr="10.0.0.0/8"))
    with pytest.raises(BadInput, match="wider than /16"):
        PROVIDER.plan(spec, files)
    plan = PROVIDER.plan(spec.with_options(allow_wide_ssh_cidr=True), files)
    assert "SSH allowed from 10.0.0.0/8 only" in plan.notes
    with pytest.raises(BadInput, match="whole internet"):  # never the whole internet
        PROVIDER.plan(spec.with_options(allow_wide_ssh_cidr=True, ssh_cidr="0.0.0.0/0"), files)


def test_allow_wide_ssh_cidr_flag(capsys, shim: Shim, ami: str) -> None:
    """The CLI flag (cli.py, not this provider's file) sets the spec's AwsOptions.allow_wide_ssh_cidr."""
    from gpuprov.cli.app import up as up_command

    if "allow_wide_ssh_cidr" not in {p.name for p in up_command.params}:
        pytest.skip("gpuprov up has no --allow-wide-ssh-cidr flag yet (cli.py)")
    code, _, err = invoke(capsys, "up", "--name", "wideok", "--type", "g5.xlarge", "--count", "1",
                          "--image", ami, "--ssh-cidr", "10.0.0.0/8", "--allow-wide-ssh-cidr", "--dry-run")
    assert code == 0, err
    assert "SSH allowed from 10.0.0.0/8 only" in err


def _ssh_ranges(name: str) -> list[str]:
    import boto3

    (group,) = boto3.client("ec2", region_name=REGION).describe_security_groups(
        Filters=[{"Name": "tag:gpuprov:cluster", "Values": [name]}])["SecurityGroups"]
    rules = [r for r in group["IpPermissions"] if r.get("FromPort") == 22]
    return sorted([c["CidrIp"] for r in rules for c in r.get("IpRanges", [])]
                  + [c["CidrIpv6"] for r in rules for c in r.get("Ipv6Ranges", [])])


@pytest.mark.parametrize("grow", [False, True], ids=["complete-cluster", "with-shortfall"])
def test_rerun_with_another_range_replaces_the_ssh_rule(capsys, shim: Shim, ami: str, grow: bool) -> None:
    def run(cidr: str, count: int) -> None:
        code, _, err = invoke(capsys, "up", "--name", "moved", "--type", "g5.xlarge", "--count", str(count),
                              "--image", ami, "--ssh-cidr", cidr, "--no-bootstrap", "--yes")
        assert code == 0, err

    run(CIDR, 1)
    assert _ssh_ranges("moved") == [CIDR]
    run("198.51.100.0/24", 2 if grow else 1)
    assert _ssh_ranges("moved") == ["198.51.100.0/24"]
    assert "RevokeSecurityGroupIngress" in shim.actions()
    run("2001:db8:5::/48", 2)
    assert _ssh_ranges("moved") == ["2001:db8:5::/48"]
    assert len(instances("moved")) == 2
    # the same range again (written another way) changes nothing
    before = len(shim.mutating())
    run("2001:DB8:5:0::/48", 2)
    assert len(shim.mutating()) == before


# -- finding 12 ------------------------------------------------------------------------------
def test_count_over_the_maximum_creates_nothing(capsys, shim: Shim, ami: str) -> None:
    code, out, err = invoke(capsys, "up", "--name", "huge", "--type", "g5.xlarge", "--count", "400",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    # the bound gpuprov launches in one cluster (256), read with the flag itself (defaults.MAX_NODES)
    assert_refused(code, out, err, "'--count': 400 is not in the range 1<=x<=256", shim)
    _nothing_tagged("huge")


def test_absurd_count_without_a_readable_quota_is_refused_at_once(shim: Shim, ami: str) -> None:
    started = time.monotonic()
    proc = run_cli("up", "--name", "absurd", "--type", "g5.xlarge", "--count", "1000000000", "--image", ami,
                   "--ssh-cidr", CIDR, "--yes", env=dict(os.environ), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "'--count': 1000000000 is not in the range 1<=x<=256" in proc.stderr
    assert time.monotonic() - started < 30
    assert shim.mutating() == []
    _nothing_tagged("absurd")


def test_vcpu_quota_is_checked_before_anything_is_created(capsys, shim: Shim, ami: str) -> None:
    shim.quotas["L-DB2E81BA"] = 64  # G and VT: 16 x g5.xlarge (4 vCPUs) = 64, 17 is one too many
    code, out, err = invoke(capsys, "up", "--name", "quota", "--type", "g5.xlarge", "--count", "17",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "needs 68 vCPUs but the quota", shim)
    _nothing_tagged("quota")


def test_user_data_size_is_judged_in_plan(shim: Shim, ami: str, gpuprov_home: Path, monkeypatch) -> None:
    from gpuprov.providers.aws import PROVIDER, userdata

    files = ClusterFiles(gpuprov_home / "clusters" / "sized")
    spec = ClusterSpec(name="sized", provider="aws", instance_type="g5.xlarge", count=256,
                       options=AwsOptions(image=ami, ssh_cidr=CIDR))
    plan = PROVIDER.plan(spec, files)  # one bootstrap key whatever the count: well under 16 KiB
    assert plan.details.user_data_size < 4096
    monkeypatch.setattr(userdata, "USER_DATA_LIMIT", 1024)
    with pytest.raises(BadInput, match="over EC2's 1024"):
        PROVIDER.plan(spec, files)
    assert shim.mutating() == []


# -- finding 14 ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "config", "flag", "expected"),
    [
        ({"AWS_DEFAULT_REGION": "eu-west-1"}, None, None, "eu-west-1"),
        ({"AWS_REGION": "eu-west-2"}, None, None, "eu-west-2"),  # botocore ignores it; gpuprov reads it
        ({"AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "eu-west-2"}, None, None, "eu-west-1"),
        ({}, "ap-south-1", None, "ap-south-1"),
        ({"AWS_REGION": "eu-west-2"}, "ap-south-1", None, "eu-west-2"),  # environment before the file
        ({"AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "eu-west-2"}, "ap-south-1", "us-west-2", "us-west-2"),
    ],
    ids=["default-region", "region", "default-before-region", "config-file", "env-before-file", "flag-first"],
)
def test_region_sources(shim: Shim, monkeypatch, tmp_path: Path, env, config, flag, expected) -> None:
    from gpuprov.providers.aws import api

    for var in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    if config:
        path = tmp_path / "aws-config"
        path.write_text(f"[default]\nregion = {config}\n")
        monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    aws = api.connect(flag)
    assert aws.region == expected
    assert aws.ec2.meta.region_name == expected


def test_aws_region_alone_reaches_ec2(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", REGION)
    code, _, err = invoke(capsys, "up", "--name", "viaregion", "--type", "g5.xlarge", "--count", "1",
                          "--image", ami, "--ssh-cidr", CIDR, "--dry-run")
    assert code == 0, err
    assert f"region {REGION}; zones offering g5.xlarge" in err


def test_no_region_names_the_variables(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    code, out, err = invoke(capsys, "up", "--name", "noregion", "--type", "g5.xlarge", "--count", "1",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "no AWS region: pass --region, or set AWS_DEFAULT_REGION (or AWS_REGION)", shim)


def test_unknown_region_from_a_variable_says_where_it_came_from(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "us-est-1")
    code, out, err = invoke(capsys, "up", "--name", "typo", "--type", "g5.xlarge", "--count", "1",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "unknown AWS region 'us-est-1' (from AWS_REGION)", shim)


