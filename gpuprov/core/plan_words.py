"""`up`'s plan in words: what will exist, what it costs, which stack it gets."""

from __future__ import annotations

from gpuprov.console import Console
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import Plan, Provider
from gpuprov.results.costs import PlanCost


def show_plan(plan: Plan, lock: LockData, console: Console, provider: Provider) -> None:
    spec = plan.spec
    total = plan.existing + plan.to_create
    line = f"plan: {spec.name} ({spec.provider}): {total} x {spec.instance_type or 'node'}"
    if plan.existing and plan.to_create:
        line += f" ({plan.existing} exist, {plan.to_create} to create)"
    elif plan.existing and not provider.adopts_existing:
        line += " (all exist already)"
    console.say(line)
    cost_line(plan, total, console)
    for note in plan.notes:
        console.say(f"  {note}")
    console.say(
        f"  stack: driver {lock['driver']} ({lock['source']}), CUDA {lock['cuda']}, "
        f"cuDNN {lock['cudnn']}"
        + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else "")
        + f" [lock {lock['hash']}]"
    )


def cost_line(plan: Plan, total: int, console: Console) -> None:
    """What the cluster costs per hour and per day, with the price's kind, source and date; or
    why there is no price (local and static clusters, a type with none known)."""
    from gpuprov.pricing import cost, prices  # lazy: CLI start-up

    why = cost.why_no_price(plan.spec.provider)
    if why:
        console.say(f"  cost: none shown: {why}")
        return
    price = plan.price
    if price is None:
        console.say("  cost: unknown (see the note below)")
        return
    hour = price.usd_per_hour * total
    console.say(f"  cost: ${prices.usd(hour)}/hour, ${prices.usd(hour * 24)}/day for {total} node(s) at "
                f"${prices.usd(price.usd_per_hour)}/node/hour ({price.words()}; list price: an estimate, not a quote)")


def plan_cost(plan: Plan) -> PlanCost:
    """The cost ``cost_line`` says, as data (`up --dry-run -o json`'s ``cost``)."""
    from gpuprov.pricing import cost  # lazy: CLI start-up

    total = plan.existing + plan.to_create
    why = cost.why_no_price(plan.spec.provider)
    price = None if why else plan.price
    if price is None:
        return PlanCost(nodes=total, usd_per_node_hour=None, usd_per_hour=None, usd_per_day=None, kind=None,
                        region=None, zone=None, source=None, as_of=None,
                        why=why or "no price known for this type in this region")
    hour = round(price.usd_per_hour * total, 6)
    return PlanCost(nodes=total, usd_per_node_hour=price.usd_per_hour, usd_per_hour=hour,
                    usd_per_day=round(hour * 24, 6), kind=price.kind, region=price.region, zone=price.zone,
                    source=price.source, as_of=price.as_of, why=None)
