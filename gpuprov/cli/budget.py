"""`gpuprov up --max-price USD [--regions R1,R2]`: launch the cheapest allowed choice that has
capacity (gpuprov.providers.aws.selection ranks them; this runs `up` on each in turn)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuprov.cli.registry import core
from gpuprov.console import Console
from gpuprov.errors import BadInput
from gpuprov.providers import facts, having


def up_within_budget(request_for: Callable[[str | None, str | None], Any], instance_type: str | None,
                     region: str | None, regions: str | None, max_price: float | None, spot: bool, provider: str,
                     console: Console, confirm: Callable[[Any], bool]) -> tuple[Any, Any]:
    """`up --max-price [--regions]`: the cheapest allowed (type, region) first; on no capacity in
    any of its zones, the next-cheapest (gpuprov.providers.aws.selection)."""
    from gpuprov.providers.aws import selection  # lazy: CLI start-up
    from gpuprov.providers.aws.common import NoCapacity  # lazy: CLI start-up

    if not facts(provider).priced:
        raise BadInput("--max-price and --regions choose among EC2 types and regions: they go with "
                       + " or ".join(f"--provider {n}" for n in having("priced")))
    if max_price is None:
        raise BadInput("--regions goes with --max-price (one region to launch in: --region)")
    found, notes = selection.choices(instance_type, selection.parse_regions(regions, region), max_price, spot)
    for note in notes:
        console.say(note)
    for i, choice in enumerate(found):
        console.say(selection.why(choice, found[i + 1:], max_price))
        request = request_for(choice.itype.name, choice.region)
        try:
            return request, core("up").up(request, console=console, confirm=confirm)
        except NoCapacity as exc:
            if i + 1 == len(found):
                raise
            console.say(f"{exc}; going on to the next-cheapest")
    raise AssertionError("unreachable: choices() returns at least one choice")
