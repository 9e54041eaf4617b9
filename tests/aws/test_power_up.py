"""`up --scheduler slurm --max-count M` on aws (gpuprov.slurm.power_aws_bundle.set_up, issue 56), against the
emulated EC2 and IAM (moto behind the shim): the image the dynamic nodes boot from checked
before anything is made; the cluster's set-up for its controller's power service (launch
template, role with the account's managed policy alone, the instance profile on the
controller's instance) and what the slurm play hands the service, taken by the service's own
`--check`; `down` terminates the dynamic nodes the service launched and leaves no instance,
template, role or profile.

What is not here: the slurm play on real nodes on the emulated EC2 (the role's tasks are its
molecule scenario's, roles/slurm/molecule/default, in `make test-extended`), and a dynamic node
of a Slurm image joining a real controller (tests/aws/test_power_join.py goes up to the image's
check). `up` runs with --no-bootstrap here; the set-up is what the first play that configures
Slurm makes (provision.run_site), called as it calls it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuprov.console import Console
from gpuprov.providers import get as get_provider
from gpuprov.providers.aws import api, power, power_setup
from gpuprov.state import Store
from tests.aws.conftest import REGION, instances
from tests.aws.helpers import assert_refused, invoke, up
from tests.aws.images import baked_ami
from tests.aws.moto_shim import Shim
from tests.conftest import ROOT

TYPE = "p4d.24xlarge"  # EFA: 4 network cards


@pytest.fixture
def managed(shim: Shim) -> str:
    """The managed policy an administrator makes once from docs/aws-iam-policy-power.json."""
    return str(api.connect(REGION).client("iam").create_policy(
        PolicyName=power_setup.MANAGED_POLICY,
        PolicyDocument=(ROOT / "docs" / "aws-iam-policy-power.json").read_text())["Policy"]["Arn"])


def _lock(capsys, ami: str) -> str:
    code, _, err = invoke(capsys, "up", "--name", "probe", "--type", TYPE, "--count", "1", "--image", ami,
                          "--ssh-cidr", "203.0.113.7/32", "--scheduler", "slurm", "--dry-run")
    assert code == 0, err
    return re.search(r"\[lock ([0-9a-f]{12})\]", err).group(1)


def test_max_count_without_a_slurm_image_for_the_lock_is_one_line_and_makes_nothing(capsys, shim: Shim,
                                                                                    ami: str) -> None:
    lock = _lock(capsys, ami)
    baked_ami(ami, lock)  # baked for the lock, but not from a Slurm node
    baked_ami(ami, "0123456789ab", slurm=True)  # a Slurm node's, for another lock
    shim.calls.clear()
    code, out, err = up(capsys, ami, "el", "--scheduler", "slurm", "--max-count", "3", count=1, itype=TYPE)
    assert_refused(code, out, err, f"no image of this account is baked for lock {lock} from a Slurm node", shim)
    assert f"`gpuprov image bake --provider aws --type {TYPE}" in err and "--scheduler slurm` bakes it" in err
    for bad, needle in ((("--max-count", "1"), "smaller than --count 2"),
                        (("--max-count", "3", "--idle-minutes", "0"), "'--idle-minutes': 0 is not in the range"),
                        (("--max-count", "3", "--scheduler", "none"), "dynamic nodes are Slurm's"),
                        (("--max-count", "3", "--replace-unhealthy"), "--replace-unhealthy on aws: not built yet")):
        code, out, err = up(capsys, ami, "el", "--scheduler", "slurm", *bad, count=2, itype=TYPE)
        assert_refused(code, out, err, needle, shim)
    # An existing Slurm cluster given dynamic nodes by `provision`: refused before anything is recorded.
    from gpuprov.slurm import scheduler

    code, _, err = up(capsys, ami, "st", "--scheduler", "slurm", count=1, itype=TYPE)
    assert code == 0, err
    shim.calls.clear()
    code, out, err = invoke(capsys, "provision", "st", "--max-count", "3")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"no image of this account is baked for lock {lock}" in err
    assert shim.mutating() == [] and scheduler.of(Store().get_cluster("st")).max_count is None


def _check_config(files_dir: Path, service: dict) -> None:
    """The service's own --check on its configuration as the slurm role writes it."""
    role_vars = yaml.safe_load((ROOT / "roles" / "slurm" / "vars" / "main.yml").read_text())
    config = files_dir / "check.json"
    config.write_text(json.dumps({**service["aws"]["config"], "key_file": role_vars["__slurm_power_key"],
                                  "rests": role_vars["__slurm_power_aws_rests"]}))
    done = subprocess.run([sys.executable, "-I", "-S", service["aws"]["pyz_src"], "--check", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def _as_ec2_reports_it(cluster, shim: Shim):
    """The cluster's record with each node's placement group as EC2's DescribeInstances reports
    it (Placement.GroupName): moto's leaves it out, so it is taken from `up`'s own RunInstances
    (p4d x 2: a cluster placement group, tests/aws/test_up.py)."""
    import dataclasses

    (launch,) = [c for c in shim.run_calls() if not c.dry_run and c.params.get("Placement.GroupName")]
    group = launch.params["Placement.GroupName"]
    return dataclasses.replace(cluster, nodes=[dataclasses.replace(n, extra={**n.extra, "placement_group": group})
                                               for n in cluster.nodes])


def test_an_elastic_cluster_is_set_up_for_its_controller_and_down_leaves_nothing(capsys, shim: Shim, ami: str,
                                                                                managed: str) -> None:
    from gpuprov.cluster import files_for
    from gpuprov.slurm import power_aws_bundle, scheduler

    lock = _lock(capsys, ami)
    image = baked_ami(ami, lock, slurm=True)
    code, _, err = up(capsys, ami, "el", "--scheduler", "slurm", "--max-count", "4", count=2, itype=TYPE)
    assert code == 0, err
    cluster = _as_ec2_reports_it(Store().get_cluster("el"), shim)
    files, provider = files_for("el"), get_provider("aws")
    console = Console()
    got = power_aws_bundle.set_up(cluster, provider, files, cluster.nodes, console.say)
    again = power_aws_bundle.set_up(cluster, provider, files, cluster.nodes, console.say)  # found, nothing made twice
    assert again == got
    aws = api.connect(REGION)
    name = power_setup.role_name("el", REGION)
    assert sorted(power_setup.found(aws, "el")) == sorted(
        ["launch template gpuprov-el-dynamic", f"role {name}", f"instance profile {name}"])
    controller = next(n for n in cluster.nodes if n.name == scheduler.controller_of(cluster))
    (held,) = aws.ec2.describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [controller.id]}])["IamInstanceProfileAssociations"]
    assert held["IamInstanceProfile"]["Arn"].endswith(f"/{name}")
    config = got["aws"]["config"]
    assert config["image"] == image and config["instance_type"] == TYPE and config["count"] == 2
    # EFA as on the static nodes: one interface per card, in the cluster's group (not in the template).
    assert config["efa_cards"] == 4 and config["security_group"] == power_setup.cluster_group(aws, "el")
    data = aws.ec2.describe_launch_template_versions(LaunchTemplateId=config["launch_template"])[
        "LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert "SecurityGroupIds" not in data and data["InstanceType"] == TYPE
    like = next(n for n in cluster.nodes if n.name == scheduler.template_node(cluster))
    assert config["placement_groups"] == [[like.zone, f"gpuprov-el-{like.zone}"]]  # the static nodes' spine
    assert config["subnets"][0][0] == controller.zone  # the controller's zone is tried first
    assert config["join"] == {"controller_addr": controller.extra["private_ip"]}
    assert got["url"] == f"http://127.0.0.1:{config['port']}/power" and got["resume_timeout"] == 900
    _check_config(files.dir, got)
    play = scheduler.play_vars(cluster, files, cluster.nodes)
    assert [d["name"] for d in play["gpuprov_slurm_dynamic_nodes"]] == ["el-dy-1", "el-dy-2"]
    assert play["gpuprov_slurm_power"]["resume_timeout"] == 900
    assert play["gpuprov_slurm_power_service"]["aws"] == got["aws"]
    assert f"2 dynamic node(s) of {TYPE} boot from {image}" in capsys.readouterr().err

    # What the controller's service does at a resume (power.resume, as the service calls it),
    # then `down`: the template first, every instance (the dynamic one too), the role and profile.
    plan = power.Plan("el", config["launch_template"], image, TYPE, dict(config["subnets"]), 4,
                      config["security_group"])
    started = power.resume(aws.ec2, plan, "el-dy-1", power.Rests(), 0.0, "t-1")
    assert isinstance(started, power.Started), started
    run = shim.run_calls()[-1].params  # (moto keeps one interface per device index: its call says the four)
    assert [run[f"NetworkInterface.{k}.NetworkCardIndex"] for k in range(1, 5)] == ["0", "1", "2", "3"]
    assert len(instances("el")) == 3
    assert len(provider.describe("el", cluster.nodes, files)) == 2  # a dynamic node is not a static one
    code, _, err = invoke(capsys, "down", "el", "--yes")
    assert code == 0, err
    assert err.index("launch template gpuprov-el-dynamic deleted") < err.index("terminating 3 instance(s)"), err
    assert instances("el") == [] and power_setup.found(aws, "el") == []
