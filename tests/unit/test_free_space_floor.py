"""The free space a node's root file system must have before the bootstrap installs anything:
one number the preflight role asserts and the CLI checks `--disk-gb` against, read from both."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuprov import defaults
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec
from gpuprov.providers.aws import preflight
from gpuprov.providers.aws.options import AwsOptions

ROOT = Path(__file__).parents[2]


def test_the_cli_and_the_role_ask_the_same_floor() -> None:
    role = yaml.safe_load((ROOT / "roles/gpu_preflight/defaults/main.yml").read_text())
    assert role["gpu_preflight_root_free_gib"] == defaults.NODE_FREE_GIB
    molecule = yaml.safe_load((ROOT / ".config/molecule/config.yml").read_text())
    assert molecule["provisioner"]["inventory"]["group_vars"]["all"]["gpu_preflight_root_free_gib"] == \
        defaults.LOCAL_NODE_FREE_GIB


def _spec(disk: int, image: str | None = None) -> ClusterSpec:
    return ClusterSpec(name="c", provider="aws", instance_type="g5.xlarge", count=1,
                       options=AwsOptions(disk_gb=disk, image=image, ssh_cidr="192.0.2.1/32"))


@pytest.mark.parametrize(("disk", "image", "least"), [(47, None, 48), (39, "ami-0123456789abcdef0", 40)])
def test_a_root_volume_the_preflight_would_refuse_is_refused_before_launch(disk: int, image: str | None,
                                                                           least: int) -> None:
    with pytest.raises(BadInput, match=rf"--disk-gb {disk} leaves the node less than the 40 GiB free .*"
                                       rf"give --disk-gb {least} or more"):
        preflight.check_spec(_spec(disk, image))
    assert preflight.check_spec(_spec(least, image)).options.disk_gb == least
