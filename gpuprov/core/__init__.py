"""Lifecycle: plan, up, down, provision, verify, exec, and what reads state.

This module holds what the commands share; each command lives beside it (launching: up,
removal: down, reading: list/status/inventory/settings, converge: provision/verify).

Each public function is what one CLI command calls. They validate first
(``BadInput`` before anything is created or changed), then act, then return
a frozen dataclass of core/results.py (the JSON shapes of docs/json-output.md; `down`,
which prints no JSON, a small dict).
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuprov import paths, validate
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles, Provider
from gpuprov.providers import get as get_provider
from gpuprov.state import ClusterRecord, NodeRecord, Store

# What a cluster has reached, in order. `status` and `list` show it; `up` run
# again goes on from it. A failed step is recorded beside it (``failed_step``).
PHASES = ("launching", "launched", "reachable", "bootstrapped", "verified")


class Console:
    """What the core needs to talk to a person: rich's Console on stderr."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console as RichConsole

        self.rich = RichConsole(stderr=True, quiet=quiet, highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        self.rich.print(text, highlight=False, markup=False)


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
    """One mutating gpuprov command per cluster at a time, across processes."""
    lock_dir = paths.home() / "locks"
    lock_dir.mkdir(exist_ok=True, mode=0o700)
    fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            raise GpuprovError(
                f"cluster '{name}' is busy: another gpuprov process (pid {holder}) is changing it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def load(store: Store, name: str) -> ClusterRecord:
    cluster = store.get_cluster(name)
    if cluster is None:
        raise BadInput(f"unknown cluster '{name}'; `gpuprov list` shows the clusters")
    return cluster


def expectations(provider: Provider, nodes: list[NodeRecord],
                 lock: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """What the probes should find on each node: the provider's view plus the version lock."""
    return {n.name: {**provider.expectations(n), "stack": lock} for n in nodes}


def version_lock(store: Store, cluster: ClusterRecord) -> dict[str, Any]:
    """The cluster's version lock: resolved once, stored, then the same on every run."""
    if cluster.lock:
        return cluster.lock
    from gpuprov import stack

    itype = cluster.spec.get("instance_type") or next(
        (n.instance_type for n in cluster.nodes if n.instance_type), None)
    lock = stack.resolve(itype, source=stack.default_source(cluster.provider)).as_dict()
    store.set_lock(cluster.name, lock)
    return lock


def refresh(store: Store, cluster: ClusterRecord) -> tuple[Provider, ClusterFiles, list[NodeRecord]]:
    """Ask the provider what exists now; update state to match (nodes `up --keep-failed` set
    aside stay out: gpuprov.core.replacing)."""
    from gpuprov.core.replacing import without_kept

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


def reporter(console: Console) -> Callable[[str], None]:
    """How providers report progress: one indented line each."""
    return lambda message: console.say(f"  {message}")


# The commands live beside this module; imported last, as they use the helpers above.
from gpuprov.core.converge import provision, verify  # noqa: E402
from gpuprov.core.launching import up  # noqa: E402
from gpuprov.core.reading import change_settings, inventory, list_clusters, status  # noqa: E402
from gpuprov.core.removal import down  # noqa: E402
from gpuprov.core.settings import play_secrets, playbook_vars  # noqa: E402

__all__ = [
    "Console",
    "change_settings",
    "down",
    "inventory",
    "list_clusters",
    "play_secrets",
    "playbook_vars",
    "provision",
    "status",
    "up",
    "verify",
]
