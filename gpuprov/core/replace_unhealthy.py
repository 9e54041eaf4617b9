"""`--replace-unhealthy` (issue 56): a static node of an elastic Slurm cluster on local nodes that
its own health program drained is replaced, once its jobs have ended, by a fresh node from the
image the cluster's dynamic nodes boot from, under the same name. The cluster's power service
(gpuprov.core.power_service) finds such nodes at each of its checks and calls ``replace``.

A replacement, in order (each step one line of the service's log):

1. Which nodes: the static nodes Slurm has ``drained`` (not ``draining``: no job runs there any
   more) with a Reason of gpuprov's health program (``gpuprov health: ...``). Never the Slurm
   controller, nor the node of the accounting database (their state is the cluster's); never a
   node drained by a person or held by `patch` (another Reason).
2. The old node is removed and the cluster's record loses it; the replacement is recorded in
   the cluster's spec (``replaced``: old, new, why, when), as `patch --onto-image` records its.
3. `up` of the cluster at its recorded count: the new node takes the freed name (the provider's
   lowest free number), boots from the image, its host key pinned; the plays recorded with the
   choice (`--tags` of the command that turned it on: the whole site without) converge on it,
   and the health gate recorded with it holds it (the probes too, for the whole site). Slurm's
   configuration names the same node, so no other node's changes.
4. Slurm: the node's drain lifted (``State=RESUME``) once it converged and passed its gate: it
   takes jobs again. A node whose replacement fails stays out of the cluster's record and is
   set DOWN in Slurm with why; the service does not try it again until it restarts.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from gpuprov.cluster import cluster_lock, load, refresh
from gpuprov.console import Console, reporter
from gpuprov.core.onto_image import spec_of
from gpuprov.core.up import UpRequest, up
from gpuprov.errors import ClusterBusy, GpuprovError
from gpuprov.providers import get as get_provider
from gpuprov.results.shapes import UpResult
from gpuprov.slurm import drain, scheduler
from gpuprov.slurm.power_rules import serving
from gpuprov.state import ClusterRecord, Store, now

# A command that takes the cluster between the old node's removal and the new node's `up` is
# waited for (its holder named in the log at the end), this many times this long.
BUSY_TRIES = 60
BUSY_WAIT_S = 10.0


def candidates(cluster: ClusterRecord, nodes: dict[str, Any]) -> list[tuple[str, str]]:
    """(node, Slurm Reason) of each static node to replace now: drained by its own health, its
    jobs ended; none where the cluster did not ask for replacements."""
    chosen = scheduler.of(cluster)
    if chosen.replace is None:
        return []
    kept = {scheduler.controller_of(cluster)}
    if chosen.accounting:
        kept.add(scheduler.dbd_of(cluster, chosen))
    return [(n.name, nodes[n.name].reason) for n in cluster.nodes
            if n.name not in kept and n.name in nodes and nodes[n.name].state == "drained"
            and nodes[n.name].reason.startswith(drain.HEALTH)]


def replace(name: str, node: str, reason: str, image: str, *, console: Console, store: Store) -> UpResult:
    """Replace static node ``node`` of cluster ``name`` (drained for ``reason``) with a fresh one
    from ``image`` (baked for the cluster's lock: the caller checked it). GpuprovError, naming
    the step, where it fails; the node is then no longer the cluster's."""
    cluster = load(store, name)
    chosen = scheduler.of(cluster).replace
    assert chosen is not None, "replace() of a cluster that did not ask for it"
    provider = get_provider(cluster.provider)
    with cluster_lock(name):
        cluster = load(store, name)
        old = next((n for n in cluster.nodes if n.name == node), None)
        if old is None:
            raise GpuprovError(f"{node} is no longer a node of {name}")
        count = len(cluster.nodes)
        _, files, _ = refresh(store, cluster)
        stuck = provider.terminate_nodes([old], files, reporter(console))
        if stuck:
            raise GpuprovError(f"removing {node}: it would not go")
        store.replace_nodes(name, [n for n in cluster.nodes if n.id != old.id])
        done = list(cluster.spec.get("replaced") or [])
        done.append({"old": node, "new": node, "why": f"drained by its own health ({reason}); from {image}",
                     "when": now()})
        store.set_spec(name, {**load(store, name).spec, "replaced": done})
    spec = spec_of(load(store, name), image=image, count=count)
    request = UpRequest(spec, health=chosen.health, tags=",".join(chosen.plays) or None, verify=not chosen.plays,
                        rollback=True)
    for attempt in range(BUSY_TRIES):
        try:
            result = up(request, console=console, store=store)
            break
        except ClusterBusy:  # a command took the cluster between the removal and this: nothing done yet
            if attempt == BUSY_TRIES - 1:
                raise
            time.sleep(BUSY_WAIT_S)
    why = failure(result)
    if why:
        raise GpuprovError(f"the new {node} {why}")
    _lift_drain(load(store, name), files, node)
    return dataclasses.replace(result, nodes=[r for r in result.nodes if r.name == node])


def _lift_drain(cluster: ClusterRecord, files: Any, node: str) -> None:
    """The new node's drain lifted where its slurmd's health program (run when slurmd starts, and
    lifting its own drains once its checks pass) has not lifted it already."""
    status = scheduler.slurm_status(cluster, files, list(cluster.nodes))
    if status is None or status.error or node not in status.nodes:
        raise GpuprovError(f"the new {node} converged, but Slurm did not say its state: "
                           f"{status.error if status else 'no controller'}")
    now = status.nodes[node]
    if serving(now.state) and "drain" not in now.state:
        return
    if not now.reason.startswith(drain.HEALTH):
        raise GpuprovError(f"the new {node} converged, but Slurm has it {now.state} ({now.reason or 'no reason'})")
    why = scheduler.resume_nodes(cluster, files, [node])
    if why:
        raise GpuprovError(f"the new {node} converged, but its drain could not be lifted: {why}")


def failure(result: UpResult) -> str:
    """What failed in ``result``, the `up` of a replacement; "" where nothing did."""
    if result.bootstrap is not None and not result.bootstrap.ok:
        return "did not converge"
    if result.health is not None and not result.health.ok:
        return "failed its health gate"
    if result.verdict is not None and result.verdict.ready is False:
        return f"failed: {result.verdict.why}"
    return ""
