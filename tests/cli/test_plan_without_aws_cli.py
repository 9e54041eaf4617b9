"""`up --dry-run` where boto3 finds no AWS credentials (no variable, empty config and credentials
files, no metadata service): the plan and its cost from the bundled prices, in --region's or the
default us-east-1 (said), one line naming what it could not check, exit 0, nothing recorded. A
real `up` without credentials is refused as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.state import Store
from tests.conftest import invoke

UP = ("up", "--name", "plan", "--type", "p4d.24xlarge", "--count", "4", "--yes")


def nothing_recorded(gpuprov_home: Path) -> None:
    assert Store().list_clusters() == []
    assert not (gpuprov_home / "clusters").exists()


def test_a_plan_and_its_cost_without_credentials_or_region(capsys, no_aws: Path, gpuprov_home: Path) -> None:
    code, _, err = invoke(capsys, *UP, "--dry-run")
    assert code == 0, err
    assert "plan: plan (aws): 4 x p4d.24xlarge" in err
    assert ("cost: $87.83/hour, $2,107.93/day for 4 node(s) at $21.96/node/hour (on-demand in us-east-1, "
            "bundled table as of 2026-08-26") in err
    assert "region us-east-1 (the default, as `gpuprov types` takes it" in err
    unchecked = [line for line in err.splitlines() if "not checked" in line]
    assert len(unchecked) == 1 and "not checked without AWS credentials:" in unchecked[0], err
    for what in ("capacity", "vCPU quota", "the image", "EC2 DryRun"):
        assert what in unchecked[0]
    assert "dry run: ec2:" not in err and "no AWS" not in err
    nothing_recorded(gpuprov_home)


def test_the_region_given_prices_the_plan(capsys, no_aws: Path, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, *UP, "--dry-run", "--region", "eu-west-1", "-o", "json")
    assert code == 0, err
    cost = json.loads(out)["cost"]
    assert (cost["region"], cost["source"], cost["nodes"]) == ("eu-west-1", "bundled table", 4), cost
    assert cost["usd_per_hour"] == pytest.approx(4 * cost["usd_per_node_hour"])
    assert "region eu-west-1 (from --region)" in err
    nothing_recorded(gpuprov_home)


def test_the_profiles_region_prices_the_plan(capsys, no_aws: Path, gpuprov_home: Path) -> None:
    no_aws.write_text("[default]\nregion = us-west-2\n")
    code, _, err = invoke(capsys, *UP, "--dry-run")
    assert code == 0, err
    assert "on-demand in us-west-2, bundled table" in err and "region us-west-2 (from profile 'default'" in err


def test_a_spot_plan_without_credentials_says_why_it_has_no_price(capsys, no_aws: Path, gpuprov_home: Path) -> None:
    code, _, err = invoke(capsys, *UP, "--dry-run", "--spot")
    assert code == 0, err
    assert "cost: unknown" in err and "no spot price of p4d.24xlarge in us-east-1 fetched yet" in err


def test_a_launch_without_credentials_is_still_refused(capsys, no_aws: Path, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, *UP, "--region", "us-east-1")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith("gpuprov: no AWS credentials found"), err
    nothing_recorded(gpuprov_home)
