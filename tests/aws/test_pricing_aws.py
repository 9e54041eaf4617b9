"""Live prices against moto: `types --refresh` (DescribeInstanceTypes, the Price List API,
DescribeSpotPriceHistory), the offline fallback, `up`'s plan with a spot price, and `status`'s
cost over a node's lifetime (moto's spot price history, served for real).

moto has no Price List Query API: ``pricing_api_fixture`` (a FIXTURE) answers GetProducts on
the real boto3 client (botocore validates the request against the real service model first),
with documents in the API's real shape. Cost: a moto reset (about 1 s) per test, then 1 to 9 s
on the 2-core machine: `--refresh` pages through every type moto's DescribeInstanceTypes knows
and asks the Price List (the fixture) and the spot history for the 65 GPU ones (the slowest
test, about 9 s); the others launch at most two instances without a bootstrap. 35 s in all."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuprov.state import Store
from tests.aws.helpers import invoke, up
from tests.aws.moto_shim import Shim
from tests.fixtures.price_list import document as _document

# FIXTURE: GetProducts answers, each one document of tests/fixtures/price_list.py (the Price
# List Query API's real shape; VALUES EDITED): 52.5 marks an answer of this fixture, not the
# bundled table's 55.04.
FIXTURE_USD = {"p5.48xlarge": "52.5000000000", "p4d.24xlarge": "20.1000000000"}


@pytest.fixture
def pricing_api_fixture(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """FIXTURE for the AWS Price List Query API (moto lacks it): GetProducts on the real client
    answers FIXTURE_USD's documents; every request it saw is returned for the test to read."""
    import boto3
    from botocore.awsrequest import AWSResponse

    from gpuprov.pricing import live

    seen: list[dict[str, Any]] = []

    def answer(model: Any, params: dict[str, Any], **_: Any) -> Any:
        if model.name != "GetProducts":
            return None
        body = json.loads(params["body"])  # the request as botocore serialised it for the wire
        seen.append(body)
        wanted = {f["Field"]: f["Value"] for f in body["Filters"]}
        usd = FIXTURE_USD.get(wanted["instanceType"])
        docs = [_document(wanted["instanceType"], usd, wanted["regionCode"])] if usd else []
        http = AWSResponse(params["url"], 200, {}, None)
        return http, {"FormatVersion": "aws_v1", "PriceList": docs, "ResponseMetadata": {"HTTPStatusCode": 200}}

    client = boto3.client("pricing", region_name="us-east-1")
    client.meta.events.register("before-call.pricing.GetProducts", answer)
    monkeypatch.setattr(live, "pricing_client", lambda aws: client)
    return seen


def test_refresh_caches_the_price_list_and_spot_history(capsys, shim: Shim, pricing_api_fixture) -> None:
    code, out, err = invoke(capsys, "types", "--refresh", "--region", "us-east-1", "--gpu", "H100", "-o", "json")
    assert code == 0, err
    assert "on-demand price(s) of us-east-1 from the AWS Price List API" in err
    p5 = {r["instance_type"]: r for r in json.loads(out)}["p5.48xlarge"]
    assert p5["price"]["usd_per_hour"] == 52.5 and p5["price"]["source"] == "AWS Price List API"
    assert p5["price"]["as_of"].startswith(datetime.now(UTC).strftime("%Y-%m-%d"))
    asked = {f["Field"]: f["Value"] for f in pricing_api_fixture[0]["Filters"]}
    assert asked | {"instanceType": "-"} == {"instanceType": "-", "regionCode": "us-east-1",
                                             "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                                             "capacitystatus": "Used", "licenseModel": "No License required"}
    assert pricing_api_fixture[0]["ServiceCode"] == "AmazonEC2"
    # Spot: moto's DescribeSpotPriceHistory, per zone (moto serves 0.00001 in every zone).
    code, out, err = invoke(capsys, "types", "--spot", "--gpu", "H100", "-o", "json")
    p5 = {r["instance_type"]: r for r in json.loads(out)}["p5.48xlarge"]
    assert (p5["price"]["usd_per_hour"], p5["price"]["kind"], p5["price"]["zone"]) == (0.00001, "spot", "us-east-1a")
    assert p5["price"]["source"] == "EC2 spot price history"


def test_without_the_price_list_api_the_bundled_table_answers_and_says_so(capsys, shim: Shim) -> None:
    # No fixture: moto does not answer GetProducts; the refresh says so and the table answers.
    code, out, err = invoke(capsys, "types", "--refresh", "--region", "us-east-1", "--gpu", "H100")
    assert code == 0, err
    assert "warning: on-demand prices not read" in err and "the bundled table (2026-08-26) answers" in err
    assert "bundled table as of 2026-08-26" in out


def test_plan_shows_the_spot_price_with_its_source(capsys, shim: Shim, ami: str) -> None:
    code, _, err = up(capsys, ami, "spotplan", "--spot", "--dry-run", count=2)
    assert code == 0, err
    line = next(x for x in err.splitlines() if "cost:" in x)
    assert "cost: $0.00002/hour, $0.00048/day for 2 node(s) at $0.00001/node/hour (spot in us-east-1 us-east-1" in line
    assert "EC2 spot price history as of" in line
    assert shim.mutating() == []
    # The same plan as data (`up --dry-run -o json`'s cost).
    code, out, err = up(capsys, ami, "spotplan", "--spot", "--dry-run", "-o", "json", count=2)
    assert code == 0, err
    cost = json.loads(out)["cost"]
    assert (cost["nodes"], cost["usd_per_node_hour"], cost["usd_per_hour"], cost["kind"]) == (2, 0.00001, 0.00002, "spot")
    assert cost["source"] == "EC2 spot price history" and cost["as_of"] and cost["why"] is None
    assert shim.mutating() == []


def test_status_cost_over_a_nodes_lifetime(capsys, shim: Shim, ami: str) -> None:
    from tests.aws.conftest import instances

    code, _, err = up(capsys, ami, "costly", count=2)
    assert code == 0, err
    launch_times = {i["InstanceId"]: i["LaunchTime"] for i in instances("costly")}
    code, out, err = invoke(capsys, "status", "costly", "-o", "json")
    after = datetime.now(UTC)
    assert code == 0, err
    data = json.loads(out)
    cost = data["cost"]
    assert len(cost["nodes"]) == 2 and cost["usd_per_hour"] == pytest.approx(2 * 21.957642)
    for node, row in zip(data["nodes"], cost["nodes"], strict=True):
        launched = launch_times[node["id"]]
        assert datetime.fromisoformat(row["launched"]) == launched  # EC2's LaunchTime, as recorded
        hours = (after - launched).total_seconds() / 3600
        assert row["kind"] == "on-demand" and row["source"].startswith("on-demand in us-east-1, bundled table")
        assert 0 <= row["usd_so_far"] <= round(21.957642 * hours, 2) + 0.01
    assert cost["usd_so_far"] == pytest.approx(sum(r["usd_so_far"] for r in cost["nodes"]))
    code, out, _ = invoke(capsys, "status", "costly")
    assert "cost: $43.92/h now" in out and "on-demand in us-east-1, bundled table as of 2026-08-26" in out


def test_status_cost_of_a_spot_node_from_the_price_history(capsys, shim: Shim, ami: str) -> None:
    code, _, err = up(capsys, ami, "spotty", "--spot", count=1)
    assert code == 0, err
    code, out, err = invoke(capsys, "status", "spotty", "-o", "json")
    assert code == 0, err
    (row,) = json.loads(out)["cost"]["nodes"]
    # moto's history: one step, 0.00001 since 2006, in force over the node's whole life.
    assert row["kind"] == "spot" and row["usd_per_hour"] == 0.00001
    assert row["source"].startswith("EC2 spot price history in us-east-1") and row["usd_so_far"] == 0.0


def test_local_clusters_show_no_price_and_say_why(capsys, gpuprov_home) -> None:
    from gpuprov.pricing import cost

    assert cost.so_far("docker", [])["why"] == "local containers on this machine: no cloud bill"
    assert "did not launch" in cost.per_hour("static", [])["why"]


US_EAST_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")


def test_max_price_takes_the_cheaper_region_and_fails_over_on_capacity(capsys, shim: Shim, ami: str) -> None:
    """p4d.24xlarge: 21.96/h in us-east-1, 23.72/h in eu-west-1 (bundled table). us-east-1 has no
    capacity in any zone (the shim's fault injection): the launch goes on to eu-west-1."""
    for zone in US_EAST_ZONES:
        shim.capacity[zone] = 0
    code, out, err = up(capsys, ami, "budget", "--max-price", "25", "--regions", "eu-west-1,us-east-1", count=2)
    assert code == 0, err
    assert ("chosen: p4d.24xlarge in us-east-1 at $21.96/h (on-demand in us-east-1, bundled table as of "
            "2026-08-26): the cheapest allowed at most $25.00/h; next-cheapest: p4d.24xlarge in eu-west-1 "
            "at $23.72/h") in err
    assert "no capacity for 2 x p4d.24xlarge in any zone of us-east-1" in err and "going on to the next-cheapest" in err
    assert "chosen: p4d.24xlarge in eu-west-1 at $23.72/h" in err
    nodes = json.loads(out)["nodes"]
    assert len(nodes) == 2 and {n["zone"][:-1] for n in nodes} == {"eu-west-1"}
    assert [c.params.get("Placement.AvailabilityZone", "")[:-1] for c in shim.run_calls()
            if c.params.get("DryRun") != "true"].count("us-east-1") >= 1


def test_a_budget_no_type_meets_is_refused_naming_the_cheapest(capsys, shim: Shim, ami: str) -> None:
    code, out, err = up(capsys, ami, "cheap", "--max-price", "10", "--regions", "us-east-1,eu-west-1", count=1)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert ("no allowed type costs at most $10.00/h on-demand in us-east-1, eu-west-1; the cheapest that would "
            "fit is p4d.24xlarge in us-east-1 at $21.96/h") in err
    assert shim.mutating() == [] and Store().list_clusters() == []


def test_max_price_without_a_type_picks_the_cheapest_gpu_type(capsys, shim: Shim, ami: str) -> None:
    code, _, err = up(capsys, ami, "anygpu", "--max-price", "0.6", "--dry-run", count=1, itype=None)
    assert code == 0, err
    assert "chosen: g4dn.xlarge in us-east-1 at $0.526/h" in err and "next-cheapest" not in err
    assert shim.mutating() == []
