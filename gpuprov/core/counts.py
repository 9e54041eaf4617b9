"""How many nodes one `up` creates, computed once for every provider.

A provider answers two questions: its plan says how many nodes carry the cluster's label now
(``Plan.existing``), and its launch creates the number it is given. Everything between is here:
the count a request must carry, the refusal to shrink, `--min-count`'s bounds and the least a
launch that falls short may bring (``Plan.min_create``), and the kept nodes (`up --min-count
--keep-failed`), which keep the label but are no longer members.
"""

from __future__ import annotations

import dataclasses

from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec, Plan, Provider, names
from gpuprov.providers import get as get_provider


def check_request(spec: ClusterSpec, provider: Provider) -> None:
    """The counts a request carries, judged before anything is asked of the provider."""
    if spec.count is None:
        if not provider.adopts_existing:
            raise BadInput("--count is required")
    elif spec.count < 1:
        raise BadInput(f"--count must be at least 1, not {spec.count}")
    if spec.min_count is not None and not provider.partial_launch:
        takers = [n for n in names() if get_provider(n).partial_launch]
        raise BadInput(f"--min-count is for --provider {' or '.join(takers)}")
    # They act on the nodes --min-count lets fail (gpuprov.core.min_count); without it `up` is
    # all or nothing, and there is nothing to keep or replace.
    for flag_name, given in (("--keep-failed", spec.keep_failed), ("--retries", spec.retries is not None)):
        if given and spec.min_count is None:
            raise BadInput(f"{flag_name} goes with --min-count K (without it `up` is all or nothing: no node "
                           "failing its bootstrap is kept or replaced)")
    if spec.min_count is not None and not 1 <= spec.min_count <= (spec.count or 0):
        raise BadInput(f"--min-count {spec.min_count} must be between 1 and --count {spec.count}")


def counted(plan: Plan, provider: Provider, kept: int = 0) -> Plan:
    """``plan`` with what to create filled in: the shortfall of members (labelled nodes less
    the ``kept`` ones) against the request's count, and the least a short launch may bring."""
    spec = plan.spec
    if provider.adopts_existing:
        return dataclasses.replace(plan, to_create=0, min_create=0)
    assert spec.count is not None  # check_request
    members = plan.existing - kept
    if members > spec.count:
        raise BadInput(
            f"cluster '{spec.name}' already has {members} node(s), more than --count {spec.count}; "
            "gpuprov does not shrink clusters (use `gpuprov down` first)"
        )
    to_create = spec.count - members
    least = to_create
    if spec.min_count is not None and to_create:
        least = min(to_create, max(1, spec.min_count - members))
    return dataclasses.replace(plan, existing=members, to_create=to_create, min_create=least)
