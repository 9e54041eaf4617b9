"""A price with its date and source; the bundled table and the cache of live answers.

Where a price comes from, best first:
- the cache of live answers, per region (``$GPUPROV_HOME/pricing/REGION.json``, written by
  ``gpuprov.pricing.live``: on-demand from the AWS Price List Query API, spot from EC2's spot
  price history, each with the time it was fetched);
- the bundled table (``gpuprov/catalog/instance_types.json``): on-demand only, each figure
  with its public source and date (``catalog.price_sources``).

No price is made up: a type and region neither knows has none (shown as ``-``, and said).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov import catalog, paths
from gpuprov.catalog import InstanceType
from gpuprov.clock import utc_text
from gpuprov.errors import DamagedFile
from gpuprov.providers import having

ON_DEMAND = "on-demand"
SPOT = "spot"
BUNDLED = "bundled table"
PRICE_LIST_API = "AWS Price List API"
SPOT_HISTORY = "EC2 spot price history"


@dataclass(frozen=True)
class Price:
    """One instance-hour of a type in a region (spot: in its cheapest zone), in USD."""

    usd_per_hour: float
    kind: str  # on-demand | spot
    region: str
    source: str  # bundled table | AWS Price List API | EC2 spot price history
    as_of: str  # the table's date, or the UTC time the answer was fetched
    zone: str | None = None  # spot: the zone this price is for

    def words(self) -> str:
        where = f"{self.region}" + (f" {self.zone}" if self.zone else "")
        return f"{self.kind} in {where}, {self.source} as of {self.as_of}"

    def public(self) -> dict[str, Any]:
        return {"usd_per_hour": self.usd_per_hour, "kind": self.kind, "region": self.region,
                "zone": self.zone, "source": self.source, "as_of": self.as_of}


def usd(value: float) -> str:
    """Dollars as people read them: cents from $1 up (21.96, 2,107.93), else the digits that
    matter (0.526, 0.00001)."""
    if value >= 1 or value == 0:
        return f"{value:,.2f}"
    return f"{value:.6f}".rstrip("0")


def now_iso() -> str:
    return utc_text()


def cache_file(region: str) -> Path:
    return paths.home() / "pricing" / f"{region}.json"


def read_cache(region: str, *, damaged_ok: bool = False) -> dict[str, Any]:
    """The cache of ``region`` as gpuprov wrote it; none there: {}. Anything else (not JSON,
    an entry of another shape) is DamagedFile, naming the file (``damaged_ok``: {}, for the
    writers, which replace it)."""
    path = cache_file(region)
    try:
        text = path.read_text()
    except OSError:
        return {}
    try:
        data = json.loads(text)
        why = _fault(data)
    except ValueError:
        why = "not JSON"
    if why is None:
        return data
    if damaged_ok:
        return {}
    raise DamagedFile("price cache", path, why, f"delete it (`gpuprov types --refresh --region {region}` "
                      "fetches the prices again)")


def _is_usd(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _fault(data: object) -> str | None:
    """What in a price cache is not what record_on_demand and record_spot write (None: nothing)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    on_demand, spot_part = data.get("on_demand", {}), data.get("spot", {})
    if not isinstance(on_demand, dict) or not isinstance(spot_part, dict):
        return "on_demand or spot is not an object"
    for row in on_demand.values():
        if not isinstance(row, dict) or not _is_usd(row.get("usd")) or not isinstance(row.get("fetched"), str):
            return "an on-demand price is not a figure with its time"
    for entry in spot_part.values():
        zones = entry.get("zones") if isinstance(entry, dict) else None
        if not isinstance(zones, dict) or not isinstance(entry.get("fetched"), str):
            return "a spot entry has no zones or time"
        for row in zones.values():
            if not isinstance(row, dict) or not _is_usd(row.get("usd")) or not isinstance(row.get("since"), str):
                return "a spot price is not a figure with its time"
    return None


def _write_cache(region: str, data: dict[str, Any]) -> None:
    path = cache_file(region)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True, indent=1))
    tmp.replace(path)


def record_on_demand(region: str, found: dict[str, float], fetched: str | None = None) -> None:
    """Cache the Price List API's on-demand prices of ``region`` (merged into what is there)."""
    data = read_cache(region, damaged_ok=True)
    entry = data.setdefault("on_demand", {})
    stamp = fetched or now_iso()
    for name, usd in found.items():
        entry[name] = {"usd": usd, "fetched": stamp}
    data["region"] = region
    _write_cache(region, data)


def record_spot(region: str, found: dict[str, dict[str, tuple[float, str]]], fetched: str | None = None) -> None:
    """Cache the newest spot price of each type in each zone of ``region``:
    {type: {zone: (usd, the time EC2 set that price)}}."""
    data = read_cache(region, damaged_ok=True)
    entry = data.setdefault("spot", {})
    stamp = fetched or now_iso()
    for name, zones in found.items():
        entry[name] = {"fetched": stamp,
                       "zones": {z: {"usd": usd, "since": since} for z, (usd, since) in zones.items()}}
    data["region"] = region
    _write_cache(region, data)


def bundled(itype: InstanceType, region: str) -> Price | None:
    usd = itype.price.get(region)
    if usd is None:
        return None
    return Price(usd_per_hour=float(usd), kind=ON_DEMAND, region=region, source=BUNDLED, as_of=catalog.price_date())


def on_demand(itype: InstanceType, region: str) -> Price | None:
    """The live answer cached for ``region``, else the bundled table's figure, else None."""
    live = (read_cache(region).get("on_demand") or {}).get(itype.name)
    if isinstance(live, dict) and isinstance(live.get("usd"), (int, float)):
        return Price(usd_per_hour=float(live["usd"]), kind=ON_DEMAND, region=region, source=PRICE_LIST_API,
                     as_of=str(live.get("fetched", "?")))
    return bundled(itype, region)


def spot_by_zone(name: str, region: str) -> dict[str, Price]:
    """The cached spot price of ``name`` in each zone of ``region`` (none cached: {})."""
    entry = (read_cache(region).get("spot") or {}).get(name) or {}
    out = {}
    for zone, row in sorted((entry.get("zones") or {}).items()):
        if isinstance(row, dict) and isinstance(row.get("usd"), (int, float)):
            out[zone] = Price(usd_per_hour=float(row["usd"]), kind=SPOT, region=region, source=SPOT_HISTORY,
                              as_of=str(entry.get("fetched", "?")), zone=zone)
    return out


def spot(name: str, region: str) -> Price | None:
    """The cheapest cached spot price of ``name`` in ``region`` (its zone named)."""
    zones = spot_by_zone(name, region)
    return min(zones.values(), key=lambda p: (p.usd_per_hour, p.zone or "")) if zones else None


def price(itype: InstanceType, region: str, *, spot_price: bool = False) -> Price | None:
    return spot(itype.name, region) if spot_price else on_demand(itype, region)


def why_none(itype: InstanceType, region: str, *, spot_price: bool = False) -> str:
    """Why a type has no price here, in words for a table's note or the plan."""
    if itype.provider not in having("priced"):
        return f"{itype.name} is a {itype.provider} machine: gpuprov knows no price for it"
    if spot_price:
        return (f"no spot price of {itype.name} in {region} fetched yet (`gpuprov types --spot --refresh "
                f"--region {region}` reads EC2's spot price history)")
    return (f"no on-demand price of {itype.name} in {region}: the bundled table ({catalog.price_date()}) has "
            f"none confirmed, and none was fetched (`gpuprov types --refresh --region {region}`)")
