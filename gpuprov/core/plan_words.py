"""`up`'s plan in words: what will exist, what it costs, which stack it gets."""

from __future__ import annotations

from typing import Any

from gpuprov import catalog
from gpuprov.providers import Plan, Provider
from gpuprov.shared.console import Console


def show_plan(plan: Plan, lock: dict[str, Any], console: Console, provider: Provider) -> None:
    spec = plan.spec
    total = plan.existing + plan.to_create
    line = f"plan: {spec.name} ({spec.provider}): {total} x {spec.instance_type or 'node'}"
    if plan.existing and plan.to_create:
        line += f" ({plan.existing} exist, {plan.to_create} to create)"
    elif plan.existing and not provider.adopts_existing:
        line += " (all exist already)"
    console.say(line)
    if plan.price_per_node_hour is not None:
        console.say(
            f"  estimate: ${plan.price_per_node_hour:.2f}/node/hour, "
            f"${plan.price_per_node_hour * total:.2f}/hour for the cluster "
            f"(on-demand list price as of {catalog.price_date()}; an estimate, not a quote"
            f"{'; spot prices differ' if spec.spot else ''})"
        )
    for note in plan.notes:
        console.say(f"  {note}")
    console.say(
        f"  stack: driver {lock['driver']} ({lock['source']}), CUDA {lock['cuda']}, "
        f"cuDNN {lock['cudnn']}"
        + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else "")
        + f" [lock {lock['hash']}]"
    )
