"""`up --max-price USD [--regions R1,R2]`: the allowed (type, region) choices under a budget,
cheapest first; `up` launches the first and, when no zone of its region has capacity
(``NoCapacity``), goes on to the next (docs/cost.md).

Allowed types: `--type`, else every EC2 GPU type gpuprov knows. Prices: on-demand from the
cache of the Price List API, else the bundled table; spot (`--spot`) from EC2's spot price
history, read here for each region (its cheapest zone). A budget no choice meets is bad
input: one line naming the cheapest that would fit, exit 2, before anything is created.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov import catalog
from gpuprov.catalog import InstanceType
from gpuprov.errors import BadInput
from gpuprov.pricing import live, prices, regions
from gpuprov.pricing.prices import Price
from gpuprov.providers.aws import api


@dataclass(frozen=True)
class Choice:
    itype: InstanceType
    region: str
    price: Price

    def words(self) -> str:
        return f"{self.itype.name} in {self.region} at ${prices.usd(self.price.usd_per_hour)}/h ({self.price.words()})"


def parse_regions(value: str | None, region: str | None) -> list[str]:
    """--regions R1,R2 (each checked), else --region, else the default region."""
    if value is not None and region is not None:
        raise BadInput("--region and --regions both name where to launch: give one")
    if value is None:
        return [regions.chosen(region)[0]]
    names = [r.strip() for r in value.split(",") if r.strip()]
    if not names:
        raise BadInput(f"--regions {value!r}: expected region names separated by commas")
    return [regions.check(r) for r in dict.fromkeys(names)]


def _spot_prices(names: list[str], region: str) -> None:
    prices.record_spot(region, live.fetch_spot(api.connect(region), names))


def choices(instance_type: str | None, where: list[str], max_price: float,
            spot: bool) -> tuple[list[Choice], list[str]]:
    """The choices within ``max_price`` per instance-hour, cheapest first (ties: the order of
    ``where``), and the notes on what was left out."""
    if not (max_price > 0):
        raise BadInput(f"--max-price {max_price}: expected US dollars per instance-hour, more than 0")
    allowed = [catalog.get(instance_type)] if instance_type else [
        t for t in catalog.all_types() if t.provider == "aws" and t.gpu_count]
    if instance_type and allowed[0].provider != "aws":
        raise BadInput(f"{instance_type} is an {allowed[0].provider} machine, not an EC2 instance type")
    found, over, unknown = [], [], []
    for rank, region in enumerate(where):
        if spot:
            _spot_prices([t.name for t in allowed], region)
        for t in allowed:
            price = prices.price(t, region, spot_price=spot)
            if price is None:
                unknown.append(f"{t.name} in {region}")
            elif price.usd_per_hour <= max_price:
                found.append((price.usd_per_hour, rank, t.name, Choice(t, region, price)))
            else:
                over.append((price.usd_per_hour, rank, t.name, Choice(t, region, price)))
    kind = "spot" if spot else "on-demand"
    if not found:
        cheapest = min(over, key=lambda c: c[:3])[3] if over else None
        fit = (f"; the cheapest that would fit is {cheapest.words()}" if cheapest
               else "; no allowed type has a known price")
        raise BadInput(f"no allowed type costs at most ${max_price:,.2f}/h {kind} in {', '.join(where)}{fit}")
    notes = [f"no {kind} price known, left out: {', '.join(unknown)}"] if unknown else []
    return [c[3] for c in sorted(found, key=lambda c: c[:3])], notes


def why(chosen: Choice, rest: list[Choice], max_price: float) -> str:
    """The plan's line: what was chosen and why, and what the next-cheapest would cost."""
    line = f"chosen: {chosen.words()}: the cheapest allowed at most ${max_price:,.2f}/h"
    if rest:
        line += f"; next-cheapest: {rest[0].words()}"
    return line
