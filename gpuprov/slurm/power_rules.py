"""The rules both power services judge dynamic nodes by: the local nodes' service on the operator's
machine (gpuprov.core.power_service) and the one on an AWS cluster's controller
(gpuprov.slurm.power_aws_node). Each reads what Slurm says of the nodes (sinfo's %T and %E) and
which of them run; neither acts here."""

from __future__ import annotations

from typing import Any

from gpuprov.slurm import drain


def orphans(running: list[str], states: dict[str, str], suspects: set[str]) -> tuple[list[str], set[str]]:
    """Of the dynamic nodes running, those Slurm says are powered down (``~`` and neither
    powering up ``#`` nor down ``%``) or does not list at all: (the orphans, seen so at this
    check and the one before; the suspects, seen so now). A node resumes as POWERING_UP before
    its program runs and powers down only after its container or instance is gone, so two checks in a row
    (RECONCILE_S apart) that find it so are no race."""
    now = {n for n in running if n not in states or ("~" in states[n] and not {"#", "%"} & set(states[n]))}
    return sorted(now & suspects), now


def unhealthy(running: list[str], nodes: dict[str, Any]) -> list[str]:
    """The dynamic nodes running that their own health program drained (Reason ``gpuprov
    health: ...``) and that run no job any more (sinfo's ``drained``, not ``draining``)."""
    return [n for n in running if n in nodes and nodes[n].state == "drained"
            and nodes[n].reason.startswith(drain.HEALTH)]


def reclaimed(running: list[str], nodes: dict[str, Any]) -> list[str]:
    """The dynamic nodes running that the spot watcher drained on EC2's interruption notice
    (Reason ``spot interruption at TIME``) and that run no job any more (their jobs signalled,
    ended or requeued by the watcher): powered down now, so the instance is terminated by
    gpuprov before EC2 takes it, and Slurm has the node back to resume elsewhere."""
    return [n for n in running if n in nodes and nodes[n].state == "drained"
            and nodes[n].reason.startswith(drain.SPOT)]


def serving(state: str) -> bool:
    """Whether a Slurm node state (sinfo's %T) is a node up and serving: registered, responding,
    not powered down or powering, not DOWN, drained or failed."""
    base = state.rstrip("*~#%!$@^-+").lower()
    return not any(c in state for c in "*~#%") and base in ("idle", "allocated", "mixed", "completing")
