"""Live prices from AWS, cached per region with the time fetched (``gpuprov.pricing.prices``).

- On-demand: the AWS Price List Query API (``pricing`` GetProducts, service AmazonEC2), one
  query per instance type, filtered to the region's code, Linux, shared tenancy, no
  pre-installed software, capacity status Used, on-demand market: each answer's ``PriceList``
  holds JSON documents whose ``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`` is the
  price per instance-hour. The API answers from us-east-1 (also eu-central-1, ap-south-1)
  whatever region's prices it is asked for.
- Spot: EC2's DescribeSpotPriceHistory (Linux/UNIX) in the region: the newest price of each
  type in each zone; over a node's lifetime for `status` (``history``).

What AWS answers is read as data: a price document, a dimension or a spot row that cannot be
read (not JSON, another shape, a price that is no positive finite number, a time that is none)
is left out, and the others answer; that type then has no live price (the bundled table
answers), never an exception for the whole refresh (tests/unit/test_review4_parsers.py).

boto3 loads here (through gpuprov.providers.aws.api), never at CLI start-up.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuprov import catalog
from gpuprov.clock import utc_text
from gpuprov.pricing import prices
from gpuprov.providers import having
from gpuprov.providers.aws import api

PRICING_REGION = "us-east-1"
PRODUCT_FILTERS = (
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
    ("licenseModel", "No License required"),
)


def pricing_client(aws: api.Aws) -> Any:
    """The Price List Query API's client (its endpoint is in us-east-1, for every region)."""
    cache = aws.__dict__.setdefault("_clients", {})
    if "pricing" not in cache:
        client = aws.session.client("pricing", region_name=PRICING_REGION, config=api.Config(
            retries={"mode": "adaptive", "max_attempts": aws.attempts}, connect_timeout=10, read_timeout=60,
            user_agent_extra="gpuprov"))
        client.meta.events.register("after-call-error", api._unreachable_hook("pricing", client.meta.endpoint_url))
        cache["pricing"] = client
    return cache["pricing"]


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _usd(value: Any) -> float | None:
    """A price as AWS writes it ("52.5000000000"): a positive finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    try:
        usd = float(value)
    except ValueError:
        return None
    return usd if 0 < usd < math.inf else None


def on_demand_usd(price_list: list[str]) -> float | None:
    """The on-demand USD per hour in a GetProducts answer's PriceList (None: none there).
    Several products (a reservation-backed SKU) may answer: the on-demand market's, lowest.
    A document or a dimension that cannot be read is left out."""
    found = []
    for doc in price_list:
        try:
            product = _object(json.loads(doc) if isinstance(doc, str) else doc)
        except (ValueError, RecursionError):
            continue
        attributes = _object(_object(product.get("product")).get("attributes"))
        if attributes.get("marketoption", "OnDemand") != "OnDemand":
            continue
        for term in _object(_object(product.get("terms")).get("OnDemand")).values():
            for dimension in map(_object, _object(_object(term).get("priceDimensions")).values()):
                usd = _usd(_object(dimension.get("pricePerUnit")).get("USD"))
                if dimension.get("unit", "Hrs") == "Hrs" and usd is not None:
                    found.append(usd)
    return min(found) if found else None


def fetch_on_demand(aws: api.Aws, region: str, names: list[str]) -> dict[str, float]:
    client = pricing_client(aws)
    out = {}
    for name in names:
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": name},
                   {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
        filters += [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in PRODUCT_FILTERS]
        docs: list[str] = []
        for page in client.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters,
                                                                    FormatVersion="aws_v1"):
            docs.extend(page.get("PriceList") or [])
        usd = on_demand_usd(docs)
        if usd is not None:
            out[name] = usd
    return out


def fetch_spot(aws: api.Aws, names: list[str]) -> dict[str, dict[str, tuple[float, str]]]:
    """The newest spot price of each type in each zone: {type: {zone: (usd, since)}}."""
    out: dict[str, dict[str, tuple[float, str]]] = {}
    pages = aws.ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=names, ProductDescriptions=["Linux/UNIX"], StartTime=datetime.now(UTC))
    for page in pages:
        for row in filter(None, map(spot_row, page.get("SpotPriceHistory") or [])):
            name, zone, since, usd = row
            at = _iso(since)
            if zone not in out.get(name, {}) or at > out[name][zone][1]:
                out.setdefault(name, {})[zone] = (usd, at)
    return out


def spot_row(row: Any) -> tuple[str, str, datetime, float] | None:
    """One DescribeSpotPriceHistory row: (type, zone, since, usd); None where it cannot be read
    (no type or zone, a price that is no positive number, a time that is none: left out)."""
    row = _object(row)
    name, zone, usd = row.get("InstanceType"), row.get("AvailabilityZone"), _usd(row.get("SpotPrice"))
    if not (isinstance(name, str) and name and isinstance(zone, str) and zone and usd is not None):
        return None
    try:
        since = _time(row.get("Timestamp"))
        _iso(since)
    except (ValueError, TypeError, OverflowError):
        return None
    return name, zone, since, usd


def history(aws: api.Aws, name: str, zone: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """The spot price of ``name`` in ``zone`` from ``start`` to ``end``: (since, usd) steps,
    oldest first, the first one in force at ``start`` (EC2 returns the price then in force)."""
    pages = aws.ec2.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=[name], ProductDescriptions=["Linux/UNIX"], AvailabilityZone=zone,
        StartTime=start, EndTime=end)
    rows = (spot_row(r) for p in pages for r in p.get("SpotPriceHistory") or [])
    steps = sorted({(r[2], r[3]) for r in rows if r is not None and r[1] == zone})
    before = [s for s in steps if s[0] <= start]
    return ([before[-1]] if before else []) + [s for s in steps if s[0] > start]


def refresh(region: str) -> list[str]:
    """`types --refresh`: EC2's GPU types, their on-demand and spot prices in ``region``, cached.
    Returns what was done, one line each (a part that fails is said, and the rest goes on)."""
    from gpuprov.providers.aws import refresh_catalog  # lazy: CLI start-up

    count, region = refresh_catalog(region)
    said = [f"cached {count} GPU instance type(s) of {region} from EC2"]
    aws = api.connect(region)
    names = sorted(t.name for t in catalog.all_types(region) if t.provider in having("priced"))
    try:
        found = fetch_on_demand(aws, region, names)
        prices.record_on_demand(region, found)
        said.append(f"cached {len(found)} on-demand price(s) of {region} from the AWS Price List API")
    except api.Unreachable:
        raise
    except Exception as exc:  # noqa: BLE001  (no pricing:GetProducts, no network: the table answers)
        said.append(f"warning: on-demand prices not read ({api.error_code(exc) or type(exc).__name__}); "
                    f"the bundled table ({catalog.price_date()}) answers")
    try:
        spot = fetch_spot(aws, names)
        prices.record_spot(region, spot)
        said.append(f"cached the spot prices of {len(spot)} type(s) in {region} from EC2's spot price history")
    except api.Unreachable:
        raise
    except Exception as exc:  # noqa: BLE001
        said.append(f"warning: spot prices not read ({api.error_code(exc) or type(exc).__name__})")
    return said


def _time(value: Any) -> datetime:
    if value is None:
        raise ValueError("no time")
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _iso(value: Any) -> str:
    return utc_text(_time(value))


def spot_cost(steps: list[tuple[datetime, float]], start: datetime, end: datetime) -> float | None:
    """USD for one instance from ``start`` to ``end`` under a step price series (None: no price
    in force at ``start``)."""
    if not steps or steps[0][0] > start:
        return None
    total = 0.0
    for i, (since, usd) in enumerate(steps):
        begin = max(since, start)
        until = min(steps[i + 1][0] if i + 1 < len(steps) else end, end)
        if until > begin:
            total += usd * ((until - begin) / timedelta(hours=1))  # hours first: no timedelta of a price
    return total


def node_history(node: Any, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """The spot price steps of a node's zone over its lifetime; [] where EC2 cannot say (the
    row then says so: `status` never fails for a price)."""
    try:
        return history(api.connect(node.extra.get("region")), node.instance_type, node.zone, start, end)
    except api.Unreachable:
        return []
    except Exception:  # noqa: BLE001  (no ec2:DescribeSpotPriceHistory: the row says no history)
        return []
