"""`gpuprov image`: bake a verified node into an image for its version lock; list; delete."""

from __future__ import annotations

import secrets
from typing import Any

from gpuprov.cluster import cluster_lock, load, refresh
from gpuprov.console import Console, reporter
from gpuprov.core.down import down
from gpuprov.core.up import UpRequest, up
from gpuprov.core.verify import verify
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.images import BakedImage
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import ClusterSpec, Provider, options_for
from gpuprov.providers import get as get_provider
from gpuprov.slurm.scheduler_choice import Scheduler
from gpuprov.state import Store


def baking_provider(name: str) -> Provider:
    provider = get_provider(name)
    if not provider.supports("bake"):
        raise BadInput(f"the {name} provider has no images to bake (baked images: docker, aws)")
    return provider


def bake_from(name: str, *, node: str | None, console: Console, store: Store | None = None,
              copy_to: tuple[str, ...] = (), confirm: Any = None) -> BakedImage:
    """Verify one node of cluster ``name`` (the first unless ``node``), then bake it. A node
    whose probes fail is not baked. Where the provider must clean the node itself
    (``bake_consumes_node``: aws), ``confirm(question)`` is asked first: the node is
    terminated after capture."""
    store = store or Store()
    cluster = load(store, name)
    provider = baking_provider(cluster.provider)
    if not cluster.lock:
        raise BadInput(f"cluster '{name}' has no version lock yet; `gpuprov up` it first")
    with cluster_lock(name):
        cluster = load(store, name)
        _, files, nodes = refresh(store, cluster)
        if not nodes:
            raise BadInput(f"cluster '{name}' has no node to bake")
        chosen = nodes[0] if node is None else next((n for n in nodes if n.name == node), None)
        if chosen is None:
            raise BadInput(f"--node {node!r}: no such node in cluster '{name}' "
                           f"({', '.join(n.name for n in nodes)})")
        if cluster.state not in ("bootstrapped", "verified"):
            raise BadInput(f"cluster '{name}' is {cluster.state}, not bootstrapped; bake only a node "
                           f"that the whole site converged (`gpuprov provision {name}`)")
        if copy_to and not provider.copies_images:
            raise BadInput(f"--copy-to: {provider.display_name or provider.name} images do not travel between regions")
    if provider.bake_consumes_node and confirm is not None and not confirm(
            f"Bake {chosen.name} of '{name}'? On {provider.display_name} the node itself is cleaned (its host "
            "keys and login keys removed), captured and terminated; "
            f"`gpuprov up {name} --count {len(nodes)}` brings the cluster back to size from the new image"):
        raise BadInput("aborted; nothing was baked")
    checked = verify(name, console=console, store=store)
    failing = [r for r in checked.hosts.get(chosen.name, []) if r.status == "fail"]
    if not checked.hosts.get(chosen.name) or failing:
        which = ", ".join(r.probe for r in failing) or "no probe ran"
        raise GpuprovError(f"{chosen.name} did not pass verify ({which}); "
                           "not baked")
    console.say(f"{chosen.name}: verified; baking an image for lock {(cluster.lock or LockData()).get('hash')}")
    with cluster_lock(name):
        image = provider.bake(load(store, name), chosen, files, reporter(console), copy_to=copy_to)
        if provider.bake_consumes_node:
            refresh(store, load(store, name))  # the node is gone from the cluster
    console.say(f"baked {image.ref} for lock {image.lock_hash}")
    if provider.bake_consumes_node:
        console.say(f"{chosen.name} was terminated with the capture; `gpuprov up {name} --count {len(nodes)}` "
                    "adds a node from the new image")
    return image


def bake_spec(name: str, instance_type: str | None, provider_name: str, region: str | None,
              slurm: bool = False) -> ClusterSpec:
    """The throwaway one-node cluster `image bake` without --from bakes: from scratch (no baked
    image), and with ``slurm`` a Slurm cluster of its own (slurmd, munge, the node's health for
    slurmd; no accounting database: a dynamic node never runs one), so that the image is one an
    elastic cluster's dynamic nodes boot from (aws tags it gpuprov:slurm)."""
    return ClusterSpec(name=name, provider=provider_name, instance_type=instance_type, count=1,
                       options=options_for(provider_name, {"no_baked": True, "region": region}),
                       scheduler=Scheduler(kind="slurm", accounting=False) if slurm else Scheduler())


def bake_type(instance_type: str | None, *, provider_name: str, console: Console,
              region: str | None = None, store: Store | None = None, confirm: Any = None,
              copy_to: tuple[str, ...] = (), slurm: bool = False) -> BakedImage:
    """The whole flow on one new node: up (from scratch), verify, bake, down (also when a
    step fails). ``slurm``: the node is a Slurm cluster's (bake_spec)."""
    baking_provider(provider_name)
    store = store or Store()
    name = f"bake-{secrets.token_hex(3)}"
    spec = bake_spec(name, instance_type, provider_name, region, slurm)
    console.say(f"baking on a new one-node cluster {name} (removed afterwards)"
                + (", a Slurm node for elastic clusters' dynamic nodes" if slurm else ""))
    try:
        result = up(UpRequest(spec, rollback=False), console=console, store=store, confirm=confirm)
        if result.bootstrap is None or not result.bootstrap.ok:
            raise GpuprovError(f"{name}: the bootstrap failed; nothing baked")
        if result.health is not None and not result.health.ok:
            raise GpuprovError(f"{name}: the health checks failed; nothing baked")
        return bake_from(name, node=None, console=console, store=store, copy_to=copy_to)
    finally:
        if store.get_cluster(name) is not None:
            down(name, console=console, store=store)


def list_images(provider_name: str, region: str | None = None) -> list[BakedImage]:
    return list(baking_provider(provider_name).baked_images(region))


def delete_image(ref: str, *, provider_name: str, region: str | None, console: Console) -> BakedImage:
    provider = baking_provider(provider_name)
    found = next((i for i in provider.baked_images(region) if ref in (i.ref, i.id)), None)
    if found is None:
        raise BadInput(f"no baked {provider_name} image {ref!r} (`gpuprov image list` shows them)")
    provider.delete_image(found, reporter(console))
    return found


__all__ = ["bake_from", "bake_type", "delete_image", "list_images"]
