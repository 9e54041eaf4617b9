"""Prices: the bundled table (dated, sourced), the cache of live answers, the region check,
selection by need and budget, and spot cost over a price series. No AWS here (tests/aws has it)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.pricing import prices, regions, select

DATA = Path(catalog.__file__).with_name("instance_types.json")


def test_every_bundled_price_names_a_source_with_a_date() -> None:
    raw = json.loads(DATA.read_text())
    sources = catalog.price_sources()
    for name, facts in raw["types"].items():
        if facts["provider"] != "aws":
            assert facts["price"] == {}, name
            continue
        source = sources[facts["price_source"]]
        if facts["price"]:
            assert source["date"] == catalog.price_date() and "tsaol/aws-gpu" in source["what"], name
        else:
            assert source["date"] is None, name  # unknown: shown as '-', never guessed
        assert set(facts["price"]) <= set(catalog.price_regions()), name


def test_p4_and_p5_carry_the_june_2025_cut() -> None:
    # Before the cut: p5.48xlarge 98.32, p4d.24xlarge 32.7726 (the table dated 2024-06-01).
    assert catalog.get("p5.48xlarge").price["us-east-1"] == 55.04
    assert catalog.get("p4d.24xlarge").price["us-east-1"] == 21.957642
    assert catalog.get("p5en.48xlarge").price["us-west-2"] == 63.296
    assert "p5.48xlarge 98.32 -> 55.04" in catalog.price_sources()[catalog.get("p5.48xlarge").price_source]["cut"]


def test_region_prices_differ_and_an_unsold_region_has_none(gpuprov_home: Path) -> None:
    p3 = catalog.get("p3.2xlarge")
    assert prices.on_demand(p3, "us-east-1").usd_per_hour == 3.06
    east = prices.on_demand(p3, "eu-west-1")
    assert (east.usd_per_hour, east.source, east.as_of) == (3.305, prices.BUNDLED, catalog.price_date())
    p5 = catalog.get("p5.48xlarge")
    assert prices.on_demand(p5, "eu-west-1") is None
    assert "no on-demand price of p5.48xlarge in eu-west-1" in prices.why_none(p5, "eu-west-1")


def test_unknown_region_is_refused_as_up_refuses_it() -> None:
    with pytest.raises(BadInput, match=r"^unknown AWS region 'eu-wst-1'; did you mean eu-west-1"):
        regions.check("eu-wst-1")
    assert regions.check("ap-south-2") == "ap-south-2"  # a region the bundled table does not price


def test_the_cache_of_live_answers_wins_over_the_table_and_says_when(gpuprov_home: Path) -> None:
    prices.record_on_demand("us-east-1", {"p5.48xlarge": 50.0}, fetched="2026-11-27T10:00:00Z")
    got = prices.on_demand(catalog.get("p5.48xlarge"), "us-east-1")
    assert (got.usd_per_hour, got.source, got.as_of) == (50.0, prices.PRICE_LIST_API, "2026-11-27T10:00:00Z")
    assert prices.on_demand(catalog.get("p5.48xlarge"), "us-west-2").source == prices.BUNDLED
    prices.record_spot("us-east-1", {"p5.48xlarge": {"us-east-1a": (30.0, "t1"), "us-east-1b": (21.5, "t2")}})
    cheapest = prices.spot("p5.48xlarge", "us-east-1")
    assert (cheapest.usd_per_hour, cheapest.zone, cheapest.kind) == (21.5, "us-east-1b", prices.SPOT)
    assert prices.spot("p4d.24xlarge", "us-east-1") is None


def names(found: list[select.Offer]) -> list[str]:
    return [o.itype.name for o in found]


def test_filters_and_the_default_order_by_price_per_gpu_hour(gpuprov_home: Path) -> None:
    aws = [t for t in catalog.all_types() if t.provider == "aws"]
    found, _ = select.offers(aws, "us-east-1", select.Need(gpus=8, efa=True))
    per_gpu = [o.per_gpu for o in found if o.per_gpu is not None]
    assert per_gpu == sorted(per_gpu) and all(o.itype.gpu_count >= 8 and o.itype.efa for o in found)
    assert names(found)[0] == "g5.48xlarge"  # 16.288 / 8 = 2.036 per GPU-hour
    assert names(found)[-1] == "p5e.48xlarge"  # no price: last
    found, _ = select.offers(aws, "us-east-1", select.Need(min_gpu_mem=80, nvswitch=True, sort="price"))
    assert names(found)[:3] == ["p4de.24xlarge", "p5.48xlarge", "p5en.48xlarge"]
    found, _ = select.offers(aws, "us-east-1", select.Need(cuda="13"))
    assert "p3.2xlarge" not in names(found) and "g4dn.xlarge" in names(found)  # Volta: no CUDA 13
    found, _ = select.offers(aws, "us-east-1", select.Need(sort="gpus"))
    assert found[0].itype.gpu_count == 8 and found[-1].itype.gpu_count == 1


def test_budget_leaves_out_the_unpriced_and_says_so(gpuprov_home: Path) -> None:
    aws = [t for t in catalog.all_types() if t.provider == "aws"]
    found, notes = select.offers(aws, "us-east-1", select.Need(max_price=40, nvswitch=True))
    assert names(found) == ["p4d.24xlarge", "p4de.24xlarge"]
    assert notes == ["left out, no on-demand price known in us-east-1: p5e.48xlarge"]
    need = select.Need(max_price=0.1, gpus=8)
    found, _ = select.offers(aws, "us-east-1", need)
    assert found == [] and "the cheapest is g5.48xlarge at $16.29/h" in select.unanswered(aws, "us-east-1", need, found)


def test_training_rule_puts_the_fabric_first_then_price_per_gpu(gpuprov_home: Path) -> None:
    aws = [t for t in catalog.all_types() if t.provider == "aws"]
    found, _ = select.offers(aws, "us-east-1", select.Need(purpose="training", max_price=40))
    assert names(found)[:2] == ["p4d.24xlarge", "p4de.24xlarge"]  # NVSwitch + EFA, 2.74 < 3.43 per GPU-h
    assert found[0].why[:3] == ["training: NVSwitch and EFA first, then $/GPU-hour",
                                "NVSwitch: all-to-all NVLink", "EFA x4"]
    first_without = next(o for o in found if not o.itype.nvswitch)
    assert first_without.itype.efa  # EFA without NVSwitch before neither
    assert all(o.price.usd_per_hour <= 40 for o in found)


def test_inference_rule_is_the_cheapest_that_fits(gpuprov_home: Path) -> None:
    aws = [t for t in catalog.all_types() if t.provider == "aws"]
    found, _ = select.offers(aws, "us-east-1", select.Need(purpose="inference", min_gpu_mem=24))
    assert names(found)[0] == "g6.xlarge"  # L4 24 GiB at 0.8048, cheaper than g5.xlarge's 1.006
    assert found[0].why[0] == "inference: the cheapest instance whose GPU memory fits"
    assert all(o.itype.gpu_memory_gib >= 24 for o in found)
    found, _ = select.offers(aws, "us-east-1", select.Need(purpose="inference", min_gpu_mem=48))
    assert names(found)[0] == "g6e.xlarge"


@pytest.mark.parametrize(("need", "needle"), [
    (select.Need(gpus=0), "--gpus 0"),
    (select.Need(min_gpu_mem=-1), "--min-gpu-mem -1"),
    (select.Need(max_price=0), "--max-price 0"),
    (select.Need(max_price=float("nan")), "--max-price nan"),
    (select.Need(purpose="training", sort="price"), "--sort and --for training"),
])
def test_bad_needs_are_refused(need: select.Need, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        need.check()


def test_spot_cost_over_a_known_price_series() -> None:
    from gpuprov.pricing.live import spot_cost

    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    series = [(t0 - timedelta(hours=5), 10.0), (t0 + timedelta(hours=2), 4.0), (t0 + timedelta(hours=3), 6.0)]
    # 2 h at 10, 1 h at 4, 1.5 h at 6 = 33.0
    assert spot_cost(series, t0, t0 + timedelta(hours=4.5)) == pytest.approx(33.0)
    assert spot_cost(series[1:], t0, t0 + timedelta(hours=1)) is None  # no price in force at launch


def test_status_cost_over_ten_hours_with_a_known_spot_series(gpuprov_home: Path) -> None:
    """`status`'s cost (gpuprov.pricing.cost.so_far) for an on-demand node and a spot node over
    the same 10 hours; the spot node's zone history: 12.0, then 8.0 after 4 hours."""
    from gpuprov.pricing import cost
    from gpuprov.state import NodeRecord

    t0 = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    now = t0 + timedelta(hours=10)

    def node(name: str, spot: bool) -> NodeRecord:
        return NodeRecord(name=name, id=f"i-{name}", address="", ssh_port=22, user="gpuprov", state="running",
                          zone="us-east-1b", instance_type="p4d.24xlarge",
                          extra={"region": "us-east-1", "spot": spot, "launched": t0.isoformat()})

    asked = []

    def history(n: NodeRecord, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
        asked.append((n.name, n.zone, start, end))
        return [(t0 - timedelta(days=2), 12.0), (t0 + timedelta(hours=4), 8.0)]

    got = cost.so_far("aws", [node("od", False), node("sp", True)], now=now, history=history)
    od, sp = got["nodes"]
    assert (od["usd_per_hour"], od["usd_so_far"]) == (21.957642, 219.58)
    assert (sp["usd_per_hour"], sp["usd_so_far"]) == (8.0, 96.0)  # 4 h x 12 + 6 h x 8
    assert asked == [("sp", "us-east-1b", t0, now)]
    assert (got["usd_per_hour"], got["usd_so_far"]) == (29.9576, 315.58)
    stopped = cost.so_far("aws", [NodeRecord(**{**node("x", False).__dict__, "state": "stopped"})], now=now)
    assert stopped["nodes"][0]["why"] == "stopped: not billed for compute now" and stopped["usd_so_far"] == 0
