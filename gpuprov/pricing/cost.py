"""What a cluster costs: per hour now (`list`), and each node's cost since launch (`status`).

aws only: local (docker) and static clusters show no price, and say why. On-demand nodes:
the on-demand price (live cache, else the bundled table) x hours since the node's launch
time (EC2's LaunchTime; Linux is billed per second). Spot nodes: EC2's spot price history in
the node's zone over its lifetime (``gpuprov.pricing.live.history``), step by step. An
estimate from list prices, not a bill: no discounts, storage or traffic.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuprov import catalog
from gpuprov.clock import utc_text
from gpuprov.pricing import prices
from gpuprov.providers import facts

RUNNING = ("pending", "running")


def why_no_price(provider: str) -> str | None:
    """Why a provider's clusters show no price (None: they do: a provider with a cloud bill)."""
    known = facts(provider)
    return None if known.priced else known.no_price or f"{provider}: gpuprov knows no price"


def node_price(node: Any) -> prices.Price | None:
    """A node's price per hour now, from what is cached or bundled (no AWS call)."""
    itype = catalog.find(node.instance_type)
    region = node.extra.get("region")
    if itype is None or not region:
        return None
    return prices.price(itype, region, spot_price=bool(node.extra.get("spot")))


def per_hour(provider: str, nodes: list[Any]) -> dict[str, Any]:
    """`list`: the cluster's price per hour (running nodes), with its sources, or why none."""
    why = why_no_price(provider)
    if why:
        return {"usd_per_hour": None, "why": why}
    running = [n for n in nodes if n.state in RUNNING]
    found = [node_price(n) for n in running]
    if any(p is None for p in found):
        unknown = sorted({n.instance_type for n, p in zip(running, found, strict=True) if p is None})
        return {"usd_per_hour": None, "why": f"no price known for {', '.join(unknown)} (`gpuprov types --refresh`)"}
    sources = sorted({f"{p.kind}, {p.source} as of {p.as_of}" for p in found if p})
    return {"usd_per_hour": round(sum(p.usd_per_hour for p in found if p), 4), "why": "; ".join(sources)}


def launch_time(node: Any) -> datetime | None:
    return parse_utc(node.extra.get("launched"))


def parse_utc(text: Any) -> datetime | None:
    """An ISO 8601 time as gpuprov records it (``Z`` or an offset; none: UTC), or None."""
    if not text:
        return None
    try:
        stamp = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def so_far(provider: str, nodes: list[Any], *, now: datetime | None = None,
           history: Any = None) -> dict[str, Any]:
    """`status`: each node's launch time, price and cost so far, and the cluster's totals.
    ``history(node, start, end)``: the spot price steps of the node's zone (default: EC2's spot
    price history, asked only for spot nodes)."""
    why = why_no_price(provider)
    if why:
        return {"nodes": [], "usd_per_hour": None, "usd_so_far": None, "why": why}
    now = now or datetime.now(UTC)
    if history is None and any(n.extra.get("spot") for n in nodes):
        from gpuprov.pricing import live  # lazy: CLI start-up (boto3)

        history = live.node_history
    rows = []
    for node in nodes:
        launched = launch_time(node)
        price = node_price(node)
        row: dict[str, Any] = {"node": node.name, "launched": utc_text(launched) if launched else None,
                               "kind": "spot" if node.extra.get("spot") else "on-demand",
                               "usd_per_hour": None, "usd_so_far": None, "source": None, "why": None}
        if node.state not in RUNNING:
            row["why"] = f"{node.state}: not billed for compute now"
        elif launched is None:
            row["why"] = "launch time unknown"
        elif node.extra.get("spot"):
            from gpuprov.pricing import live  # lazy: CLI start-up (boto3)

            steps = history(node, launched, now)
            row["usd_so_far"] = _cents(live.spot_cost(steps, launched, now))
            row["usd_per_hour"] = steps[-1][1] if steps else None
            row["source"] = f"{prices.SPOT_HISTORY} in {node.zone}, {len(steps)} price step(s) since launch"
            row["why"] = None if steps else f"no spot price history for {node.zone}"
        elif price is None:
            row["why"] = f"no price known for {node.instance_type} (`gpuprov types --refresh`)"
        else:
            row["usd_per_hour"] = price.usd_per_hour
            row["usd_so_far"] = _cents(price.usd_per_hour * max((now - launched).total_seconds(), 0) / 3600)
            row["source"] = price.words()
        rows.append(row)
    known = [r for r in rows if r["usd_per_hour"] is not None]
    complete = len(known) == len([n for n in nodes if n.state in RUNNING])
    return {
        "nodes": rows,
        "usd_per_hour": round(sum(r["usd_per_hour"] for r in known), 4) if complete else None,
        "usd_so_far": _cents(sum(r["usd_so_far"] or 0 for r in rows)) if complete else None,
        "why": None if complete else "some node's price is unknown: see its row",
    }


def _cents(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
