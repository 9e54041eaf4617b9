"""`down`: a recorded cluster through its provider; an unrecorded one through every provider
that finds clusters by label."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuprov import providers
from gpuprov.cluster import cluster_lock, files_for, kept_alive, refresh, validate_name
from gpuprov.console import Console, reporter
from gpuprov.core import elastic, slurm_accounts
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.probes.run import control_dir
from gpuprov.providers import Orphans, Provider
from gpuprov.providers import get as get_provider
from gpuprov.slurm import scheduler
from gpuprov.state import ClusterRecord, Store


def down(
    name: str,
    *,
    console: Console,
    store: Store | None = None,
    confirm: Callable[[str], bool] | None = None,
    region: str | None = None,
    keep_accounting: bool = False,
) -> dict[str, Any]:
    store = store or Store()
    cluster = store.get_cluster(name)
    if cluster is None:
        if keep_accounting:
            validate_name(name)
            raise BadInput(f"--keep-accounting: no cluster '{name}' is recorded here, so there is no Slurm "
                           "accounting to export (`gpuprov list` shows the clusters)")
        return down_unrecorded(name, console=console, confirm=confirm, region=region)
    if keep_accounting:
        slurm_accounts.refuse_without_accounting(cluster, "--keep-accounting")
    elif has_accounting(cluster):
        console.say(f"{name}: its Slurm accounting database (every job's record) goes with its node "
                    f"{scheduler.dbd_of(cluster)}; `gpuprov down {name} --keep-accounting` exports it first")
    provider = get_provider(cluster.provider)
    # Nodes `up --keep-failed` set aside are removed with the cluster (those still there).
    nodes = [*cluster.nodes, *kept_alive(provider, cluster)]
    what, done = provider.removal(len(nodes))
    if confirm is not None and not confirm(f"{name}: {what}?"):
        raise GpuprovError("aborted; nothing was removed")
    exported = None
    with cluster_lock(name):
        files = files_for(name)
        if keep_accounting:
            exported = export_accounting(store, cluster, console)
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
        remove_files(files.dir)
    console.say(f"{name}: down ({removed} node(s) {done})")
    if exported is not None:
        console.say(f"{name}: its accounting is kept in {exported}")
    return {"cluster": name, "provider": cluster.provider, "removed": removed,
            "accounting": None if exported is None else str(exported)}


def has_accounting(cluster: ClusterRecord) -> bool:
    chosen = scheduler.of(cluster)
    return chosen.kind == "slurm" and chosen.accounting


def export_accounting(store: Store, cluster: ClusterRecord, console: Console) -> Path:
    """`--keep-accounting`: the export (gpuprov.core.slurm_accounts), or GpuprovError before
    anything is removed (a half-written export removed with it)."""
    _, files, nodes = refresh(store, cluster)
    try:
        return slurm_accounts.export(cluster, files, nodes, console)
    except (GpuprovError, OSError) as exc:
        raise GpuprovError(f"{cluster.name}: the accounting export failed ({exc}); nothing was removed: "
                           f"run it again, or `gpuprov down {cluster.name}` without --keep-accounting "
                           "removes the cluster and its records") from None


def remove_files(directory: Path) -> None:
    """The cluster's directory, but for the accounting exports of `down --keep-accounting`."""
    kept = list(directory.glob(f"{slurm_accounts.EXPORT_PREFIX}*"))
    if not kept:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for child in directory.iterdir():
        if child in kept:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


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
