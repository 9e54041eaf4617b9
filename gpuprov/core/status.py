"""`status` and the other commands that read state (and the providers' view of it): list,
status, inventory, settings."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuprov import providers
from gpuprov import settings as cluster_settings
from gpuprov.ansible.inventory import render, to_json
from gpuprov.cluster import cluster_lock, expectations, load, refresh
from gpuprov.console import Console
from gpuprov.core import elastic
from gpuprov.core.monitoring import monitoring_host
from gpuprov.errors import GpuprovError
from gpuprov.lock import stack
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import Provider, get
from gpuprov.results.shapes import (
    ClusterCost,
    ClusterPrice,
    ClusterRow,
    DynamicNodes,
    KeptNode,
    NodeImage,
    PowerService,
    Protection,
    Replacement,
    RunRow,
    SettingsResult,
    SlurmStatus,
    StatusResult,
    node_rows,
    settings_of,
)
from gpuprov.slurm import scheduler
from gpuprov.slurm.elastic import DEFAULT_IDLE_MINUTES
from gpuprov.state import Store


def list_clusters(
    store: Store | None = None, *, region: str | None = None, console: Console | None = None
) -> list[ClusterRow]:
    """Clusters in state, reconciled with what each provider that lists by label finds
    (AWS tags, when AWS is set up here).

    A cluster whose nodes are gone is marked ``missing at PROVIDER``; labelled
    resources that no state knows are listed with state ``untracked (tags only)``:
    `gpuprov down NAME` removes them.
    """
    store = store or Store()
    from gpuprov.pricing import cost  # lazy: CLI start-up

    clusters = store.list_clusters()
    rows = [ClusterRow(name=c.name, provider=c.provider, nodes=len(c.nodes), created=c.created,
                       state=c.state_text, price=ClusterPrice(**cost.per_hour(c.provider, list(c.nodes))),
                       changed_by=c.changed_by, changed_at=c.changed_at)
            for c in clusters]
    for provider in providers.supporting("list_tagged_clusters"):
        mine = any(r.provider == provider.name for r in rows)
        regions: set[str | None] = {region} if region else {
            c.spec.get("region") for c in clusters if c.provider == provider.name} | {None}
        tagged = _tagged(provider, regions, bool(region or mine), console)
        if tagged is not None:
            rows = _reconcile(provider, rows, tagged)
    return rows


def _reconcile(provider: Provider, rows: list[ClusterRow],
               tagged: dict[str, dict[str, Any]]) -> list[ClusterRow]:
    """``rows`` with the provider's rows in state updated from ``tagged``, then the untracked
    rows."""
    out = []
    for row in rows:
        if row.provider != provider.name:
            out.append(row)
            continue
        found = tagged.pop(row.name, None)
        if found is None or not found["nodes"]:
            out.append(dataclasses.replace(row, nodes=0, state=f"{row.state} (missing at {provider.name})",
                                           price=ClusterPrice(usd_per_hour=None, why=f"no nodes at {provider.name}")))
        else:
            out.append(dataclasses.replace(row, nodes=found["nodes"]))
    return out + [
        ClusterRow(name=name, provider=provider.name, nodes=found["nodes"], created=found["created"],
                   state="untracked (tags only)")
        for name, found in sorted(tagged.items())
    ]


def _tagged(provider: Provider, regions: set[str | None], asked: bool,
            console: Console | None) -> dict[str, dict[str, Any]] | None:
    try:
        return provider.list_tagged_clusters(regions, asked)
    except GpuprovError as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001  (listing must work offline)
        reason = f"{type(exc).__name__}: {exc}"
    if console is not None:
        console.say(f"warning: {provider.display_name} not consulted ({reason}); showing local state only")
    return None


def status(name: str, store: Store | None = None) -> StatusResult:
    store = store or Store()
    cluster = load(store, name)
    _, files, nodes = refresh(store, cluster)
    return StatusResult(
        cluster=name, provider=cluster.provider, state=cluster.state, failed_step=cluster.failed_step,
        created=cluster.created, spec=cluster.spec, stack=cluster.lock,
        settings=settings_of(cluster_settings.recorded(cluster)), nodes=node_rows(nodes),
        runs=[RunRow.of(r) for r in store.runs(name, limit=5)],
        images=node_images(nodes, (cluster.lock or LockData()).get("hash"), _image_locks(cluster.provider, nodes)),
        replaced=[Replacement.of(r) for r in cluster.spec.get("replaced") or []],
        kept=[KeptNode(name=k["name"], id=k["id"], address=k["address"], why=k["why"], when=k["when"])
              for k in cluster.spec.get("kept") or []],
        slurm=_with_dynamic(cluster, files, scheduler.slurm_status(cluster, files, nodes), nodes),
        cost=_cost(cluster.provider, nodes),
        driver_eol=stack.eol_warning(cluster.lock),
        changed_by=cluster.changed_by, changed_at=cluster.changed_at,
    )


def _with_dynamic(cluster: Any, files: Any, slurm: SlurmStatus | None, nodes: list[Any]) -> SlurmStatus | None:
    """The Slurm status with the cluster's dynamic nodes and power service (`--max-count`)."""
    chosen = scheduler.of(cluster)
    if slurm is None or chosen.max_count is None:
        return slurm
    on_node = scheduler.power_on_node(files)
    if on_node:  # aws: the service runs on the controller, its log in its journal there
        running, last = scheduler.controller_service(cluster, files, nodes) if not slurm.error else (False, [])
        power = PowerService(url=on_node.get("url"), running=running, last=last, on_node=slurm.controller)
    else:
        service = elastic.service_state(files, cluster.name)
        power = PowerService(url=service.get("url"), running=bool(service.get("running")),
                             last=elastic.log_tail(files))
    dynamic = DynamicNodes(
        max_count=chosen.max_count, dynamic=max(0, chosen.max_count - len(cluster.nodes)),
        idle_minutes=chosen.idle_minutes or DEFAULT_IDLE_MINUTES, image=elastic.image_of(cluster),
        service=power, replace_unhealthy=chosen.replace is not None,
        protection=Protection(**protected) if (protected := elastic.protection(files)) else None)
    return dataclasses.replace(slurm, dynamic=dynamic)


def _cost(provider_name: str, nodes: list[Any]) -> ClusterCost:
    """Each node's cost since launch (spot: its zone's price history, asked of the provider)."""
    from gpuprov.pricing import cost  # lazy: CLI start-up

    return ClusterCost.of(cost.so_far(provider_name, nodes))


def _image_locks(provider_name: str, nodes: list[Any]) -> dict[str, str]:
    """The lock of each node's image, where the provider must be asked (aws: the AMIs' tags)."""
    provider = get(provider_name)
    wanted = {n.extra["image"] for n in nodes if n.extra.get("image") and not n.extra.get("image_lock")}
    if not wanted or not provider.supports("image_locks"):
        return {}
    return provider.image_locks(wanted, next((n.extra.get("region") for n in nodes if n.extra.get("region")), None))


def node_images(nodes: list[Any], lock_hash: str | None, locks: dict[str, str] | None = None) -> list[NodeImage]:
    """The image each node booted from, where its provider says (docker nodes, aws nodes); a
    baked image of another lock than the cluster's is flagged. ``locks``: image -> lock hash,
    for images whose lock the node record does not carry."""
    out = []
    for n in nodes:
        if not n.extra.get("image"):
            continue
        baked = n.extra.get("image_lock") or (locks or {}).get(n.extra["image"])
        out.append(NodeImage(node=n.name, image=n.extra["image"], baked_for=baked,
                             matches_lock=(baked == lock_hash) if baked else None))
    return out


def change_settings(name: str, changes: dict[str, str] | None = None, *, record: bool = False,
                    store: Store | None = None) -> SettingsResult:
    """The cluster's settings; ``changes`` ({key: value}, "" removes one) or ``record`` (take
    what the environment and the settings file say now) change them, under the cluster lock.
    The next `provision` or `patch` converges the nodes to them."""
    store = store or Store()
    cluster = load(store, name)
    changes = {k: cluster_settings.check(k, v, "--set") for k, v in (changes or {}).items()}
    if not changes and not record:
        return SettingsResult(cluster=name, settings=settings_of(cluster_settings.recorded(cluster)),
                              changed=[])
    with cluster_lock(name):
        cluster = load(store, name)
        before = cluster_settings.recorded(cluster) or {}
        after = cluster_settings.for_new_cluster() if record else dict(before)
        for key, value in changes.items():
            after.pop(key, None)
            if value:
                after[key] = {"value": value, "from": "gpuprov settings --set"}
        after = dict(sorted(after.items()))
        options = {**(cluster.spec.get("options") or {}), "settings": after}
        store.set_spec(name, {**cluster.spec, "options": options})
    changed = sorted(k for k in set(before) | set(after)
                     if (before.get(k) or {}).get("value") != (after.get(k) or {}).get("value"))
    return SettingsResult(cluster=name, settings=settings_of(after), changed=changed)


def inventory(name: str, store: Store | None = None) -> tuple[str, dict[str, Any]]:
    """The cluster's inventory: YAML text (as written to the state dir) and Ansible's JSON form."""
    store = store or Store()
    cluster = load(store, name)
    provider, files, nodes = refresh(store, cluster)
    context = render(cluster.name, cluster.provider, nodes, expectations(provider, nodes), files,
                     monitoring_host(cluster.spec))
    return files.inventory.read_text(), to_json(context)
