"""`gpuprov patch NAME --onto-image [REF]`: roll a fleet onto a baked image by replacing its
nodes, a batch at a time, instead of patching them in place.

The roll, in order:

1. Validate (``BadInput``, nothing touched): the provider can boot nodes from images and
   remove single nodes (docker, aws); the new lock (the patch flags move it as for an
   in-place patch; none: the cluster's own); the image: REF, which must be baked for that
   lock, or the newest image baked for it. ``--check`` stops here and says what would happen.
2. No image baked for the new lock yet (and no REF): one is baked on a throwaway one-node
   cluster of the new lock, booted from the image of the current lock where there is one
   (the move then converges on a node that already holds everything else), bootstrapped,
   verified, baked and removed.
3. The cluster's stored lock becomes the new one: the nodes added from now on converge with it.
4. Batch by batch (``--batch N``): drain hook on the old nodes; as many new nodes as the
   batch from the image, reached over SSH with pinned host keys, the site converged on them
   alone (a node booted from an image of its lock changes nothing), the probes and the health
   gate on them; then the old nodes removed and the resume hook run on the new ones. A new
   node that fails any of it is removed again, the old nodes are resumed and stay, and the
   roll stops there; a stopped roll puts the stored lock back.
5. Each replacement is recorded in the cluster's spec (``replaced``: old node, new node, why,
   when), and the roll in a run record (kind ``patch-image``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import (
    cluster_lock,
    expectations,
    files_for,
    load,
    refresh,
    validate_name,
    version_lock,
)
from gpuprov.console import Console, reporter
from gpuprov.core import health_gate
from gpuprov.core.baking import bake_from
from gpuprov.core.down import down
from gpuprov.core.patch_plan import Request, batches_of, new_lock, run_hook
from gpuprov.core.provision import run_site
from gpuprov.core.up import UpRequest, up
from gpuprov.core.up_steps import launch, prepare, record, rollback, wait_ready
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.health import run as health_run
from gpuprov.health.facts import Expect
from gpuprov.images import BakedImage, newest_for
from gpuprov.lock.lock_data import LockData
from gpuprov.probes import run as probes_run
from gpuprov.providers import ClusterSpec, Provider
from gpuprov.providers import get as get_provider
from gpuprov.results.shapes import LockMove, PatchHost, PatchResult
from gpuprov.slurm import scheduler
from gpuprov.state import ClusterRecord, NodeRecord, Store, now

KIND = "patch-image"
NEWEST = "newest"


def spec_of(cluster: ClusterRecord, *, image: str | None, no_baked: bool = False, **changes: Any) -> ClusterSpec:
    """The cluster's recorded request as a spec whose new nodes boot from ``image`` (for adding
    nodes to it, or a throwaway cluster like it)."""
    spec = ClusterSpec.from_record(cluster.name, cluster.provider, cluster.spec)
    spec = dataclasses.replace(spec, **{"count": spec.count or len(cluster.nodes), **changes})
    return spec.with_options(image=image, no_baked=no_baked)


def pick(images: list[BakedImage], ref: str, lock: LockData) -> BakedImage | None:
    """REF (baked for ``lock``, else BadInput), or the newest image baked for ``lock`` (None:
    there is none yet)."""
    if ref == NEWEST:
        return newest_for(images, lock["hash"])
    named = next((i for i in images if ref in (i.ref, i.id)), None)
    if named is None:
        raise BadInput(f"--onto-image {ref!r}: no such baked image (`gpuprov image list` shows them)")
    if named.lock_hash != lock["hash"]:
        raise BadInput(f"--onto-image {ref}: baked for lock {named.lock_hash}, and the roll moves the cluster to "
                       f"lock {lock['hash']}; name an image of that lock, or `--onto-image {NEWEST}`")
    return named


def roll_onto_image(name: str, req: Request, *, console: Console, store: Store | None = None,
                    health: str = "quick") -> PatchResult:

    health = health_gate.level(health)
    store = store or Store()
    validate_name(name)
    cluster = load(store, name)
    provider = get_provider(cluster.provider)
    if not (provider.supports("bake") and provider.supports("terminate_nodes")):
        raise BadInput(f"--onto-image: {provider.display_name or provider.name} nodes cannot be replaced from an "
                       "image (docker and aws can); patch them in place")
    if scheduler.of(cluster).kind == "slurm":
        # Slurm knows its nodes by name (slurm.conf on every node): a replacement leaves it
        # listing nodes that are gone and not knowing the new ones, and a replaced controller
        # takes slurmctld with it. Refused before anything is baked, launched or recorded.
        raise BadInput(f"--onto-image: {name} runs Slurm, whose node list would lose the replaced nodes; "
                       "patch it in place (drained through Slurm), or replace nodes with `gpuprov down`/`up` "
                       f"and `gpuprov provision {name}`")
    if req.kernel or req.microcode:
        raise BadInput("--onto-image replaces nodes with ones from an image: --kernel and --microcode patch nodes "
                       "in place; bake an image that has them instead")
    old = version_lock(store, cluster)
    lock = new_lock(old, req)
    assert req.onto_image
    region = ClusterSpec.from_record(cluster.name, cluster.provider, cluster.spec).region
    image = pick(provider.baked_images(region), req.onto_image, lock)
    names = [n.name for n in cluster.nodes]
    batches = batches_of(names, req.batch)
    how = image.ref if image else f"an image baked for lock {lock['hash']} first"
    hosts = {n: {"status": "not-started", "changed": 0, "rebooted": False, "plan": [f"replace with a node from {how}"]}
             for n in names}
    console.say(f"{name}: patch by replacing nodes from {how} (lock {old['hash']} -> {lock['hash']}), "
                f"{len(batches)} batch(es) of {req.batch}")
    result = PatchResult(cluster=name, ok=True, batches=batches, hosts={},
                         lock=LockMove(from_=old["hash"], to=lock["hash"]),
                         image=image.ref if image else None)
    if req.check:
        return dataclasses.replace(result, hosts={h: PatchHost.of(s) for h, s in hosts.items()})
    if image is None:
        image = bake_for_lock(cluster, lock, base=newest_for(provider.baked_images(region), old["hash"]),
                              console=console, store=store)
    files = files_for(name)
    run_dir = new_run_dir(files, KIND)
    run_id = store.start_run(name, KIND, str(run_dir))
    ok = False
    try:
        if lock["hash"] != old["hash"]:
            store.set_lock(name, lock)
        for number, batch in enumerate(batches, 1):
            console.say(f"{name}: batch {number}/{len(batches)}: {', '.join(batch)} -> new nodes from {image.ref}")
            if not _replace_batch(name, provider, batch, image, hosts, req, console, store, health,
                                  run_dir / f"batch-{number}"):
                rest = [h for b in batches[number:] for h in b]
                if rest:
                    console.say(f"{name}: roll stopped; not started: {', '.join(rest)}")
                break
        else:
            ok = True
    finally:
        if not ok and lock["hash"] != old["hash"]:
            store.set_lock(name, old)
        result = dataclasses.replace(result, ok=ok, image=image.ref,
                                     hosts={h: PatchHost.of(s) for h, s in hosts.items()})
        store.finish_run(run_id, ok, {
            "batches": batches, "image": image.ref, "lock": {"from": old["hash"], "to": lock["hash"]},
            "hosts": {h: {k: v for k, v in s.items() if k != "plan"} for h, s in hosts.items()}})
        console.say(f"  artifacts: {run_dir}")
    return result


def _replace_batch(name: str, provider: Provider, batch: list[str], image: BakedImage, hosts: dict[str, dict[str, Any]],
                   req: Request, console: Console, store: Store, health: str, run_dir: Any) -> bool:
    """One batch: drain, new nodes, converge, probe, health, swap. False when it stops the roll."""
    cluster = load(store, name)
    old_nodes = [n for n in cluster.nodes if n.name in batch]
    drained: list[NodeRecord] = []
    for node in old_nodes:
        ok, detail = run_hook(req.drain, name, node, "drain") if req.drain else (True, "")
        if not ok:
            hosts[node.name].update(status="failed", error=detail)
            _resume(name, drained, req, hosts)
            return False
        drained.append(node)
    try:
        added, changed = add_nodes(name, len(batch), image, console=console, store=store, health=health,
                                   run_dir=run_dir)
    except GpuprovError as exc:
        for node in old_nodes:
            hosts[node.name].update(status="failed", error=f"no replacement: {exc}")
        _resume(name, drained, req, hosts)
        console.say(f"  FAILED: {exc}; {', '.join(batch)} stay")
        return False
    with cluster_lock(name):
        _, files, _ = refresh(store, load(store, name))
        stuck = set(provider.terminate_nodes(old_nodes, files, reporter(console)))  # ids not removed
        removed = {o.id for o in old_nodes} - stuck
        store.replace_nodes(name, [n for n in load(store, name).nodes if n.id not in removed])
        _record(store, name, [(o.name, a.name) for o, a in zip(old_nodes, added, strict=True)], image)
    for old, new in zip(old_nodes, added, strict=True):
        hosts[old.name].update(status="replaced", replaced_by=new.name, changed=changed.get(new.name, 0))
        if old.id in stuck:
            hosts[old.name]["error"] = f"{old.name} could not be removed; remove it by hand"
        console.say(f"  {old.name}: replaced by {new.name} ({changed.get(new.name, 0)} change(s) converging it)")
        if req.resume:
            ok, detail = run_hook(req.resume, name, new, "resume")
            if not ok:
                hosts[old.name].update(status="failed", error=detail)
                return False
    return True


def _resume(name: str, nodes: list[NodeRecord], req: Request, hosts: dict[str, dict[str, Any]]) -> None:
    for node in nodes:
        if req.resume:
            run_hook(req.resume, name, node, "resume")


def add_nodes(name: str, count: int, image: BakedImage, *, console: Console, store: Store, health: str,
              run_dir: Any) -> tuple[list[NodeRecord], dict[str, int]]:
    """``count`` new nodes of cluster ``name`` from ``image``, converged alone (the others are
    not touched), probed and health-checked against the stored lock; removed again and
    GpuprovError when any of it fails. The new nodes, and the changes converging each."""
    cluster = load(store, name)
    provider = get_provider(cluster.provider)
    spec = spec_of(cluster, count=len(cluster.nodes) + count, image=image.ref)
    with cluster_lock(name):
        run = prepare(spec, provider, store, console)
        run.rollback = True
        record(run)
        nodes = launch(run)
        nodes = wait_ready(run, nodes)
        added = list(run.added)
        try:
            outcome = run_site(store, load(store, name), provider, run.made_files, added, console=console)
            if not outcome.ok:
                raise GpuprovError("the site did not converge on " + ", ".join(
                    f"{h}: {e}" for h, e in outcome.errors.items()) or "the new nodes")
            expect = expectations(provider, added, version_lock(store, load(store, name)))
            _gate(name, added, expect, run.files, console, health, run_dir)
        except BaseException:
            rollback(run, nodes)
            raise
    changed = {h: s.changed for h, s in outcome.hosts.items()}
    return added, changed


def _gate(name: str, added: list[NodeRecord], expect: dict[str, Any], files: Any, console: Console, health: str,
          run_dir: Any) -> None:
    """The probes and the health checks on the new nodes; GpuprovError naming each failure."""
    hosts = [n.name for n in added]
    (run_dir / "probes").mkdir(parents=True, exist_ok=True)
    probes = probes_run.run_probes(files.inventory, files.ansible_cfg, hosts, expect, run_dir / "probes",
                                   console=console.rich)
    failing = [f"{h}: {r['probe']}: {r['detail']}" for h in hosts for r in probes.get(h, []) if r["status"] == "fail"]
    if any(not probes.get(h) for h in hosts):
        failing.append("no probe ran on " + ", ".join(h for h in hosts if not probes.get(h)))
    if health != health_gate.OFF:
        expected = {n.name: Expect.of(expect[n.name], expect[n.name].get("stack"), f"gpuprov provision {name}")
                    for n in added}
        (run_dir / "health").mkdir(exist_ok=True)
        rows = health_run.check_nodes(added, expected, files, run_dir / "health", console, health)
        failing += [f"{r.node}: health {health_gate.line(r)}" for r in health_gate.failures(rows)]
    if failing:
        raise GpuprovError("the new node(s) failed: " + "; ".join(failing))


def _record(store: Store, name: str, pairs: list[tuple[str, str]], image: BakedImage) -> None:
    cluster = load(store, name)
    done = list(cluster.spec.get("replaced") or [])
    done += [{"old": old, "new": new, "why": f"rolled onto image {image.ref} (lock {image.lock_hash})", "when": now()}
             for old, new in pairs]
    store.set_spec(name, {**cluster.spec, "replaced": done})


def bake_for_lock(cluster: ClusterRecord, lock: LockData, *, base: BakedImage | None, console: Console,
                  store: Store) -> BakedImage:
    """An image for ``lock``: a throwaway one-node cluster that holds ``lock`` from the start,
    booted from ``base`` (the current lock's image) where there is one, converged, verified,
    baked and removed (also when a step fails)."""
    import secrets

    temp = f"bake-{secrets.token_hex(3)}"
    spec = spec_of(cluster, name=temp, count=1, image=base.ref if base else None, no_baked=base is None)
    console.say(f"{cluster.name}: no image baked for lock {lock['hash']}: baking one on {temp} (from "
                f"{base.ref if base else 'the default image'}; removed afterwards)")
    store.create_cluster(temp, cluster.provider, spec.as_dict(), lock=lock)
    try:
        result = up(UpRequest(spec, rollback=False), console=console, store=store)
        if result.bootstrap is None or not result.bootstrap.ok:
            raise GpuprovError(f"{temp}: the bootstrap for lock {lock['hash']} failed; nothing baked, nothing replaced")
        return bake_from(temp, node=None, console=console, store=store)
    finally:
        if store.get_cluster(temp) is not None:
            down(temp, console=console, store=store)
