"""Health as a gate: `up` runs the quick level before it reports a cluster ready,
and `patch` runs it after each batch and stops the roll on a check that fails after the patch
where it did not fail before (`--health off|quick`, default quick).

What is judged here needs no node: the level a flag asks for, and the comparison of a node's
rows before and after (gpuprov.health.run reads the nodes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuprov.errors import BadInput
from gpuprov.results.shapes import HealthCheck

OFF = "off"
# The levels a gate may ask for; `full` (NCCL across nodes) is for `gpuprov health` alone.
GATE_LEVELS = (OFF, "quick", "standard")


def level(value: str, flag: str = "--health") -> str:
    """The gate's level, or ``BadInput`` (checked before anything is created or changed)."""
    if value not in GATE_LEVELS:
        raise BadInput(f"{flag} {value}: one of {', '.join(GATE_LEVELS)}"
                       + (" (full runs across the nodes for half an hour: `gpuprov health NAME --level full`)"
                          if value == "full" else ""))
    return value


def failures(rows: Iterable[HealthCheck]) -> list[HealthCheck]:
    return [r for r in rows if r.status == "fail"]


def new_failures(before: Sequence[HealthCheck], after: Sequence[HealthCheck]) -> list[HealthCheck]:
    """The checks that fail after (a patch) and did not fail before it, by check name: an Xid
    logged before the patch (the kernel log covers the time since boot, and a node the patch
    did not reboot keeps it) fails both times and does not count against the patch."""
    failed_before = {r.check for r in failures(before)}
    return [r for r in failures(after) if r.check not in failed_before]


def line(row: HealthCheck) -> str:
    """One failing row in words: the check, what was found, the action."""
    return f"{row.check}: {row.found} -> {row.action}"


def by_node(rows: Iterable[HealthCheck]) -> dict[str, list[HealthCheck]]:
    out: dict[str, list[HealthCheck]] = {}
    for row in rows:
        out.setdefault(row.node, []).append(row)
    return out
