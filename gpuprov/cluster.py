"""A cluster as every command sees it: its name, phase, files, lock, version lock, the provider's
view of its nodes, and the nodes `up --keep-failed` set aside. Shared by the commands
(gpuprov.core), health and pull, below all three."""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpuprov import paths, ssh, validate
from gpuprov.clock import utc_text
from gpuprov.console import Console
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.lock import stack
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import ClusterFiles, Provider, facts
from gpuprov.providers import get as get_provider
from gpuprov.results.shapes import ProbeRow
from gpuprov.state import ClusterRecord, NodeRecord, Store

# What a cluster has reached, in order. `status` and `list` show it; `up` run
# again goes on from it. A failed step is recorded beside it (``failed_step``).
PHASES = ("launching", "launched", "reachable", "bootstrapped", "verified")
_NODE_FIELDS = tuple(f.name for f in dataclasses.fields(NodeRecord))


# -- names, files, locks ------------------------------------------------------------
def validate_name(name: str) -> str:
    return validate.cluster_name(name)


def phase_at_least(cluster: ClusterRecord, phase: str) -> bool:
    return cluster.state in PHASES and PHASES.index(cluster.state) >= PHASES.index(phase)


def generate_name() -> str:
    return f"gpu-{secrets.token_hex(3)}"


def files_for(name: str, create: bool = True) -> ClusterFiles:
    return ClusterFiles(paths.cluster_dir(name, create=create))


@contextmanager
def cluster_lock(name: str) -> Iterator[None]:
    """One mutating gpuprov command per cluster at a time, across processes (and, where the
    state is shared on S3, across machines: gpuprov.state_s3). The holder writes who it is into
    the lock (pid, command, since when); a refusal names it."""
    with Store().hold(name, {"pid": os.getpid(), "command": _command_words(name), "since": utc_text()}):
        yield


def _command_words(name: str) -> list[str] | None:
    """The gpuprov command this process runs, as its words and the cluster (`gpuprov provision
    demo`): the CLI command's path, never its options (a value given there stays off disk)."""
    import click

    ctx = click.get_current_context(silent=True)
    return [*ctx.command_path.split(), name] if ctx is not None else None


def load(store: Store, name: str) -> ClusterRecord:
    cluster = store.get_cluster(name)
    if cluster is None:
        raise BadInput(f"unknown cluster '{name}'; `gpuprov list` shows the clusters")
    return cluster


def expectations(provider: Provider, nodes: list[NodeRecord],
                 lock: LockData | None = None) -> dict[str, dict[str, Any]]:
    """What the probes should find on each node: the provider's view plus the version lock."""
    return {n.name: {**provider.expectations(n), "stack": lock} for n in nodes}


def version_lock(store: Store, cluster: ClusterRecord) -> LockData:
    """The cluster's version lock: resolved once, stored, then the same on every run."""
    if cluster.lock:
        return cluster.lock
    itype = cluster.spec.get("instance_type") or next(
        (n.instance_type for n in cluster.nodes if n.instance_type), None)
    lock = stack.resolve(itype, source=facts(cluster.provider).package_source).as_dict()
    store.set_lock(cluster.name, lock)
    return lock


def refresh(store: Store, cluster: ClusterRecord) -> tuple[Provider, ClusterFiles, list[NodeRecord]]:
    """Ask the provider what exists now; update state to match (nodes `up --keep-failed` set
    aside stay out: gpuprov.core.min_count)."""
    provider = get_provider(cluster.provider)
    files = files_for(cluster.name)
    nodes = without_kept(cluster, provider.describe(cluster.name, list(cluster.nodes), files))
    if nodes != list(cluster.nodes):
        store.replace_nodes(cluster.name, nodes)
    return provider, files, nodes


def reachable_nodes(cluster: ClusterRecord, nodes: list[NodeRecord]) -> list[NodeRecord]:
    if not nodes:
        raise GpuprovError(
            f"cluster '{cluster.name}' has no nodes left at its provider ({cluster.provider}); "
            f"`gpuprov down {cluster.name}` forgets it"
        )
    stopped = [n.name for n in nodes if n.state not in ("running", "reachable")]
    if stopped:
        raise GpuprovError(f"node(s) not running: {', '.join(stopped)}")
    return nodes


# -- kept nodes: at the provider, out of the node list (gpuprov.core.min_count) -------------
def kept_nodes(cluster: ClusterRecord | None) -> list[NodeRecord]:
    """The nodes `up --keep-failed` set aside (``spec.kept``), as they were recorded."""
    entries = (cluster.spec.get("kept") if cluster is not None else None) or []
    return [NodeRecord(**{k: v for k, v in e.items() if k in _NODE_FIELDS}) for e in entries]


def without_kept(cluster: ClusterRecord | None, nodes: list[NodeRecord]) -> list[NodeRecord]:
    """``nodes`` as the provider lists the cluster (by its label), less the kept ones."""
    kept = {n.id for n in kept_nodes(cluster)}
    return [n for n in nodes if n.id not in kept] if kept else nodes


def kept_alive(provider: Provider, cluster: ClusterRecord | None) -> list[NodeRecord]:
    """The kept nodes the provider still has (one may have been removed by hand)."""
    kept = kept_nodes(cluster)
    if cluster is None or not kept:
        return []
    seen = {n.id for n in provider.describe(cluster.name, list(cluster.nodes), files_for(cluster.name, create=False))}
    return [n for n in kept if n.id in seen]


# -- the rounds --------------------------------------------------------------------------------


# -- which nodes answer SSH (provision, verify, patch, monitor) --------------------------------
# The one row an unreachable node gets in `verify`, instead of a failure per probe.
REACHABLE_PROBE = "reachable"


def check_reachable(
    files: ClusterFiles, nodes: list[NodeRecord], console: Console
) -> tuple[list[NodeRecord], dict[str, str]]:
    """One SSH check per node (in parallel, pinned host keys): the nodes that answer, and
    {node: why not} for the others, each reported here in one line."""
    down = ssh.unreachable_nodes(nodes, files.login_key, files.known_hosts)
    for node in nodes:
        if node.name in down:
            console.say(f"  {node.name}: UNREACHABLE {down[node.name]}")
    return [n for n in nodes if n.name not in down], down


def unreachable_row(why: str) -> ProbeRow:
    return ProbeRow(probe=REACHABLE_PROBE, status="fail", detail=f"unreachable: {why}")
