"""`down`: a recorded cluster through its provider; an unrecorded one through every provider
that finds clusters by label."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprov import providers
from gpuprov.cluster import cluster_lock, files_for, kept_alive, validate_name
from gpuprov.console import Console, reporter
from gpuprov.core import elastic
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.probes.run import control_dir
from gpuprov.providers import Orphans, Provider
from gpuprov.providers import get as get_provider
from gpuprov.state import Store


def down(
    name: str,
    *,
    console: Console,
    store: Store | None = None,
    confirm: Callable[[str], bool] | None = None,
    region: str | None = None,
) -> dict[str, Any]:
    store = store or Store()
    cluster = store.get_cluster(name)
    if cluster is None:
        return down_unrecorded(name, console=console, confirm=confirm, region=region)
    provider = get_provider(cluster.provider)
    # Nodes `up --keep-failed` set aside are removed with the cluster (those still there).
    nodes = [*cluster.nodes, *kept_alive(provider, cluster)]
    what, done = provider.removal(len(nodes))
    if confirm is not None and not confirm(f"{name}: {what}?"):
        raise GpuprovError("aborted; nothing was removed")
    with cluster_lock(name):
        files = files_for(name)
        # The power service first: no dynamic node may be started while the nodes go.
        if elastic.stop_service(files, name):
            console.say(f"{name}: stopped its power service")
        removed = provider.terminate(name, nodes, files, reporter(console))
        store.delete_cluster(name)
        # The cluster's multiplexed SSH connections (its own directory, as ansible.cfg names
        # it): their masters end with the nodes, or idle past ControlPersist without sockets.
        sockets = control_dir(files.ansible_cfg, make=False) if files.ansible_cfg.is_file() else None
        if sockets is not None and sockets == Path.home() / ".ansible" / "cp" / name:
            shutil.rmtree(sockets, ignore_errors=True)
        shutil.rmtree(files.dir, ignore_errors=True)
    console.say(f"{name}: down ({removed} node(s) {done})")
    return {"cluster": name, "provider": cluster.provider, "removed": removed}


def down_unrecorded(
    name: str, *, console: Console, confirm: Callable[[str], bool] | None, region: str | None = None
) -> dict[str, Any]:
    """A cluster that state has lost but a provider still labels (state dir wiped)."""
    validate_name(name)
    provider, orphans = find_orphans(name, region)
    if provider is None or orphans is None:
        raise BadInput(f"unknown cluster '{name}'; `gpuprov list` shows the clusters")
    if confirm is not None and not confirm(f"{name}: not in state, but {orphans.found}; remove them?"):
        raise GpuprovError("aborted; nothing was removed")
    with cluster_lock(name):
        removed = provider.destroy_orphans(name, orphans, reporter(console))
    console.say(f"{name}: down ({removed} {orphans.removed})")
    return {"cluster": name, "provider": orphans.provider, "removed": removed}


def find_orphans(name: str, region: str | None) -> tuple[Provider | None, Orphans | None]:
    """The first provider (local ones before clouds) that still labels cluster ``name``."""
    finders = sorted(providers.supporting("find_orphans"), key=lambda p: p.billable)
    for provider in finders:
        found = provider.find_orphans(name, region)
        if found is not None:
            return provider, found
    return None, None
