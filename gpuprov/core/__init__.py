"""Lifecycle: plan, up, down, provision, verify, exec, and what reads state.

Each public function is what one CLI command calls. They validate first
(``BadInput`` before anything is created or changed), then act, then return
plain data in the JSON shapes of DESIGN.md.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuprov import paths, validate
from gpuprov.core import settings as cluster_settings
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider
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
    """Ask the provider what exists now; update state to match."""
    provider = get_provider(cluster.provider)
    files = files_for(cluster.name)
    nodes = provider.describe(cluster.name, list(cluster.nodes), files)
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


# -- up -------------------------------------------------------------------------------
def up(
    spec: ClusterSpec,
    *,
    console: Console,
    store: Store | None = None,
    dry_run: bool = False,
    bootstrap: bool = True,
    confirm: Callable[[Plan], bool] | None = None,
    name_generated: bool = False,
    rollback: bool | None = None,
) -> dict[str, Any]:
    """Launch (or complete) a cluster and bootstrap it.

    ``rollback``: when the nodes never answer SSH or the bootstrap fails,
    terminate what this run launched. ``None`` means: on for a new cluster of a
    billable provider, off otherwise (free local nodes are kept to look at).
    Failures inside the provider's launch always undo what it made.
    """
    store = store or Store()
    validate_name(spec.name)
    if spec.count < 1 and not (spec.provider == "static" and spec.count == 0):
        raise BadInput(f"--count must be at least 1, not {spec.count}")
    provider = get_provider(spec.provider)
    existing = store.get_cluster(spec.name)
    if existing is not None and existing.provider != spec.provider:
        raise BadInput(
            f"cluster name '{spec.name}' is already used by a {existing.provider} cluster; "
            "choose another --name"
        )
    # Where packages, artifacts and images come from: recorded with a new cluster, then the
    # same for every later command (an environment that says otherwise is refused).
    if existing is None:
        recorded = cluster_settings.for_new_cluster()
    else:
        cluster_settings.values(existing)
        recorded = cluster_settings.recorded(existing) or cluster_settings.for_new_cluster()
    spec = dataclasses.replace(spec, options={**spec.options, "settings": recorded})
    plan = provider.plan(spec, files_for(spec.name, create=False))
    lock = _resolve_lock(spec, existing, provider)
    if existing is None and plan.existing and spec.provider != "static":
        # Resources carry this name but this state directory never made them
        # (another GPUPROV_HOME, or lost state): never adopt or touch them.
        raise BadInput(
            f"{plan.existing} {spec.provider} node(s) labelled with cluster '{spec.name}' already "
            "exist but this state directory does not know them; choose another --name, or "
            f"remove them with `gpuprov down {spec.name}`"
        )
    if name_generated:
        console.say(f"cluster name: {spec.name} (generated; pass it to verify, provision, down)")
    _show_plan(plan, console)
    console.say(
        f"  stack: driver {lock['driver']} ({lock['source']}), CUDA {lock['cuda']}, "
        f"cuDNN {lock['cudnn']}"
        + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else "")
        + f" [lock {lock['hash']}]"
    )
    if dry_run:
        checks = getattr(provider, "dry_run", None)
        if checks is not None:
            checks(spec, _reporter(console))
        return {
            "cluster": spec.name,
            "provider": spec.provider,
            "nodes": [],
            "bootstrap": None,
            "dry_run": True,
        }
    if plan.billable and plan.to_create and confirm is not None and not confirm(plan):
        raise GpuprovError("aborted; nothing was created")
    if rollback is None:
        rollback = existing is None and plan.billable

    with cluster_lock(spec.name):
        created_record = False
        if existing is None:
            try:
                store.create_cluster(spec.name, spec.provider, spec.as_dict(), lock=lock)
            except KeyError:
                raise BadInput(
                    f"cluster name '{spec.name}' was just taken by another gpuprov "
                    "process; choose another --name"
                ) from None
            created_record = True
        files = files_for(spec.name)
        report = _reporter(console)
        known_ids = {n.id for n in existing.nodes} if existing else set()
        try:
            nodes = provider.launch(spec, files, report)
        except BaseException as exc:
            leftover = getattr(exc, "leftover_nodes", None)
            if leftover:
                # Termination failed: keep what is still there in state, so `down` finds it.
                store.replace_nodes(spec.name, [*(existing.nodes if existing else ()), *leftover])
                store.set_failed_step(spec.name, "launch")
            elif created_record:
                store.delete_cluster(spec.name)
                shutil.rmtree(files.dir, ignore_errors=True)
            else:
                store.set_failed_step(spec.name, "launch")
            raise
        added = [n for n in nodes if n.id not in known_ids]
        store.replace_nodes(spec.name, nodes)
        if existing is not None and cluster_settings.recorded(existing) is None:
            store.set_spec(spec.name, {**existing.spec, "options": {
                **(existing.spec.get("options") or {}), "settings": recorded}})
        # A cluster that gained nodes is only as far as its newest node; one that did not
        # keeps what it reached (re-running `up` goes on from there).
        _reach(store, spec.name, "launched", reset=bool(added))
        result: dict[str, Any] = {
            "cluster": spec.name,
            "provider": spec.provider,
            "nodes": [n.public() for n in nodes],
            "bootstrap": None,
        }
        if not bootstrap and not provider.pins_without_bootstrap:
            console.say(
                f"{spec.name}: {len(nodes)} node(s) running (--no-bootstrap: no SSH wait, no playbooks)"
            )
            return result
        try:
            nodes = provider.wait_ready(spec, nodes, files, report)
        except BaseException:
            if created_record and (rollback or not plan.billable):
                # All or nothing: a new cluster whose nodes never answered is removed.
                report("nodes not reachable: removing what this run launched")
                _rollback(store, spec.name, provider, files, nodes, added, report, whole=True)
            else:
                if rollback:
                    _rollback(store, spec.name, provider, files, nodes, added, report)
                if store.get_cluster(spec.name) is not None:
                    store.set_failed_step(spec.name, "reach")
            raise
        store.replace_nodes(spec.name, nodes)
        if created_record and provider.pins_without_bootstrap:
            # Hosts that already exist: their PCI buses now say what they are (NVSwitch
            # functions mean fabric manager, whatever was declared).
            try:
                seen = _resolve_lock(spec, None, provider, nodes)
            except BadInput:
                _rollback(store, spec.name, provider, files, nodes, added, report, whole=True)
                raise
            if seen["hash"] != lock["hash"]:
                console.say(f"  stack from the hosts' PCI buses: {seen['instance_type']}: driver "
                            f"{seen['driver']}, fabric manager {seen['fabricmanager'] or 'none'} "
                            f"[lock {seen['hash']}]")
                store.set_lock(spec.name, seen)
        _reach(store, spec.name, "reachable", reset=bool(added))
        if not bootstrap:
            console.say(f"{spec.name}: {len(nodes)} node(s) reachable with pinned host keys "
                        "(--no-bootstrap: no playbooks)")
            result["nodes"] = [n.public() for n in nodes]
            return result
        cluster = load(store, spec.name)
        if not added and phase_at_least(cluster, "bootstrapped"):
            console.say(f"{spec.name}: already {cluster.state}; nothing to resume "
                        f"(`gpuprov provision {spec.name}` converges again)")
            result["nodes"] = [n.public() for n in nodes]
            result["bootstrap"] = {"ok": True, "hosts": {}, "resumed_from": cluster.state}
            return result
        try:
            outcome = _provision(store, cluster, provider, files, nodes, console=console)
        except BaseException:
            if rollback:
                _rollback(store, spec.name, provider, files, nodes, added, report, whole=created_record)
            raise
        if not outcome["ok"] and rollback:
            report("bootstrap failed and --rollback is on: removing what this run launched")
            nodes = _rollback(store, spec.name, provider, files, nodes, added, report, whole=created_record)
        result["nodes"] = [n.public() for n in nodes]
        result["bootstrap"] = {"ok": outcome["ok"], "hosts": outcome["hosts"]}
        return result


def _reach(store: Store, name: str, phase: str, *, reset: bool = False) -> None:
    """Record that ``name`` reached ``phase``: never moves a cluster back unless ``reset``."""
    cluster = store.get_cluster(name)
    if cluster is None:
        return
    if reset or not phase_at_least(cluster, phase):
        store.set_cluster_state(name, phase)
    elif cluster.failed_step:
        store.set_failed_step(name, None)


def _rollback(
    store: Store,
    name: str,
    provider: Provider,
    files: ClusterFiles,
    nodes: list[NodeRecord],
    added: list[NodeRecord],
    report: Callable[[str], None],
    *,
    whole: bool = False,
) -> list[NodeRecord]:
    """Undo one ``up``: the whole cluster when it made it, else only the nodes it added
    (where the provider can remove single nodes). Returns the nodes that remain."""
    if whole:
        provider.terminate(name, nodes, files, report)
        store.delete_cluster(name)
        shutil.rmtree(files.dir, ignore_errors=True)
        return []
    terminate_nodes = getattr(provider, "terminate_nodes", None)
    if terminate_nodes is None or not added:
        return nodes
    report(f"removing the {len(added)} node(s) this run added: {', '.join(n.name for n in added)}")
    gone = {n.id for n in added} - set(terminate_nodes(added, files, report))
    kept = [n for n in nodes if n.id not in gone]
    store.replace_nodes(name, kept)
    return kept


def _resolve_lock(spec: ClusterSpec, existing: ClusterRecord | None,
                  provider: Provider | None = None,
                  nodes: list[NodeRecord] | None = None) -> dict[str, Any]:
    """The version lock for a new cluster (refused with its rule when impossible), or the one
    an existing cluster already has; a different request for an existing cluster is refused."""
    from gpuprov import stack

    validate.stack_options(spec.options)
    asked = {k: spec.options[k] for k in ("cuda", "driver", "source") if spec.options.get(k)}
    if existing is not None and existing.lock:
        lock = existing.lock
        moved = {k: v for k, v in asked.items()
                 if not (v == lock.get(k) or (k == "driver" and v == lock.get("driver_branch")))}
        if moved:
            raise BadInput(
                f"cluster '{spec.name}' is locked to driver {lock['driver']} ({lock['source']}), "
                f"CUDA {lock['cuda']}; it does not change on `up` ({', '.join(sorted(moved))} asked)"
            )
        return lock
    source = asked.get("source") or stack.default_source(spec.provider)
    if source == "mirror" and not (spec.options.get("mirror_url")
                                   and spec.options.get("mirror_key_fingerprint")):
        raise BadInput("--source mirror needs --mirror-url and --mirror-key-fingerprint "
                       "(the mirror's signing key, 40 hex digits)")
    # What the hosts are: the requested type, or (static hosts) each host's declared type or
    # GPU count and, once reached, what its PCI bus showed.
    kinds = (provider or get_provider(spec.provider)).host_types(spec, nodes)
    return stack.resolve_types(
        kinds or [],
        cuda=asked.get("cuda", "11.8"),
        driver=asked.get("driver"),
        source=source,
        label=spec.instance_type if kinds and len({k.name for k in kinds}) == 1 and spec.instance_type
        else None,
    ).as_dict()


def _show_plan(plan: Plan, console: Console) -> None:
    spec = plan.spec
    total = plan.existing + plan.to_create
    line = f"plan: {spec.name} ({spec.provider}): {total} x {spec.instance_type or 'node'}"
    if plan.existing and plan.to_create:
        line += f" ({plan.existing} exist, {plan.to_create} to create)"
    elif plan.existing and spec.provider != "static":
        line += " (all exist already)"
    console.say(line)
    if plan.price_per_node_hour is not None:
        from gpuprov import catalog

        console.say(
            f"  estimate: ${plan.price_per_node_hour:.2f}/node/hour, "
            f"${plan.price_per_node_hour * spec.count:.2f}/hour for the cluster "
            f"(on-demand list price as of {catalog.price_date()}; an estimate, not a quote"
            f"{'; spot prices differ' if spec.spot else ''})"
        )
    for note in plan.notes:
        console.say(f"  {note}")


def _reporter(console: Console) -> Callable[[str], None]:
    return lambda message: console.say(f"  {message}")


# -- down -------------------------------------------------------------------------------------
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
        return _down_orphan(name, console=console, confirm=confirm, region=region)
    provider = get_provider(cluster.provider)
    what = (
        f"forget {len(cluster.nodes)} static host(s) (the machines are not touched)"
        if cluster.provider == "static"
        else f"remove {len(cluster.nodes)} {cluster.provider} node(s) and their volumes"
    )
    if confirm is not None and not confirm(f"{name}: {what}?"):
        raise GpuprovError("aborted; nothing was removed")
    with cluster_lock(name):
        files = files_for(name)
        removed = provider.terminate(name, list(cluster.nodes), files, _reporter(console))
        store.delete_cluster(name)
        shutil.rmtree(files.dir, ignore_errors=True)
    console.say(
        f"{name}: down ({removed} node(s) {'forgotten' if cluster.provider == 'static' else 'removed'})"
    )
    return {"cluster": name, "provider": cluster.provider, "removed": removed}


def _down_orphan(
    name: str, *, console: Console, confirm: Callable[[str], bool] | None, region: str | None = None
) -> dict[str, Any]:
    """A cluster that state has lost but its provider still tags (state dir wiped)."""
    docker_provider = get_provider("docker")
    try:
        docker_provider.check_engine()  # type: ignore[attr-defined]
        found = docker_provider.describe(name, [], ClusterFiles(paths.home() / "orphans"))
    except (BadInput, GpuprovError):
        found = []
    if found:
        if confirm is not None and not confirm(
            f"{name}: not in state, but {len(found)} docker node(s) carry its label; remove them?"
        ):
            raise GpuprovError("aborted; nothing was removed")
        removed = docker_provider.terminate(name, found, ClusterFiles(paths.home()), _reporter(console))
        console.say(f"{name}: down ({removed} unrecorded docker node(s) removed)")
        return {"cluster": name, "provider": "docker", "removed": removed}
    validate_name(name)
    aws_nodes, aws_other, aws_region = _aws_tagged(name, region)
    if not aws_nodes and not aws_other:
        raise BadInput(f"unknown cluster '{name}'; `gpuprov list` shows the clusters")
    what = ", ".join([f"{len(aws_nodes)} instance(s)", *aws_other])
    if confirm is not None and not confirm(
        f"{name}: not in state, but AWS ({aws_region}) has {what} tagged with it; remove them?"
    ):
        raise GpuprovError("aborted; nothing was removed")
    aws = get_provider("aws")
    with cluster_lock(name):
        removed = aws.destroy(name, aws_region, _reporter(console))  # type: ignore[attr-defined]
    console.say(f"{name}: down ({removed} unrecorded aws instance(s) removed, found by tag)")
    return {"cluster": name, "provider": "aws", "removed": removed}


def _aws_tagged(name: str, region: str | None) -> tuple[list[NodeRecord], list[str], str | None]:
    """What AWS tags with ``name``, when AWS is set up here; nothing otherwise."""
    from gpuprov.providers.aws import api

    if not (region or api.configured()):
        return [], [], None
    aws = get_provider("aws")
    try:
        nodes, other = aws.find_tagged(name, region)  # type: ignore[attr-defined]
    except BadInput:
        return [], [], None
    return nodes, other, (nodes[0].extra["region"] if nodes else region or api.connect(region).region)


# -- reading ------------------------------------------------------------------------------------
def list_clusters(
    store: Store | None = None, *, region: str | None = None, console: Console | None = None
) -> list[dict[str, Any]]:
    """Clusters in state, reconciled with what AWS tags (when AWS is set up here).

    An aws cluster whose instances are gone is marked ``missing at aws``;
    tagged resources that no state knows are listed with state
    ``untracked (tags only)``: `gpuprov down NAME` removes them.
    """
    store = store or Store()
    rows = [
        {
            "name": c.name,
            "provider": c.provider,
            "nodes": len(c.nodes),
            "created": c.created,
            "state": c.state_text,
        }
        for c in store.list_clusters()
    ]
    aws_rows = [r for r in rows if r["provider"] == "aws"]
    tagged = _aws_clusters(store, region, bool(aws_rows), console)
    if tagged is None:
        return rows
    for row in aws_rows:
        found = tagged.pop(row["name"], None)
        if found is None or not found["nodes"]:
            row["nodes"] = 0
            row["state"] = f"{row['state']} (missing at aws)"
        else:
            row["nodes"] = found["nodes"]
    for name, found in sorted(tagged.items()):
        rows.append(
            {
                "name": name,
                "provider": "aws",
                "nodes": found["nodes"],
                "created": found["created"],
                "state": "untracked (tags only)",
            }
        )
    return rows


def _aws_clusters(
    store: Store, region: str | None, have_aws: bool, console: Console | None
) -> dict[str, dict[str, Any]] | None:
    from gpuprov.providers.aws import api

    if not (region or have_aws or api.configured()):
        return None
    regions = {region} if region else {
        c.spec.get("region") for c in store.list_clusters() if c.provider == "aws"
    } | {None}
    aws = get_provider("aws")
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in sorted(regions, key=str):
            out.update(aws.tagged_clusters(name))  # type: ignore[attr-defined]
    except GpuprovError as exc:
        if console is not None:
            console.say(f"warning: AWS not consulted ({exc}); showing local state only")
        return None
    except Exception as exc:  # noqa: BLE001  (listing must work offline)
        if console is not None:
            console.say(f"warning: AWS not consulted ({type(exc).__name__}: {exc}); showing local state only")
        return None
    return out


def status(name: str, store: Store | None = None) -> dict[str, Any]:
    store = store or Store()
    cluster = load(store, name)
    _, _, nodes = refresh(store, cluster)
    runs = store.runs(name, limit=5)
    return {
        "cluster": name,
        "provider": cluster.provider,
        "state": cluster.state,
        "failed_step": cluster.failed_step,
        "created": cluster.created,
        "spec": cluster.spec,
        "stack": cluster.lock,
        "settings": cluster_settings.recorded(cluster),
        "nodes": [n.public() for n in nodes],
        "runs": [
            {
                "id": r.id,
                "kind": r.kind,
                "started": r.started,
                "finished": r.finished,
                "ok": r.ok,
                "artifact_dir": r.artifact_dir,
            }
            for r in runs
        ],
    }


def change_settings(name: str, changes: dict[str, str] | None = None, *, record: bool = False,
             store: Store | None = None) -> dict[str, Any]:
    """The cluster's settings; ``changes`` ({key: value}, "" removes one) or ``record`` (take
    what the environment and the settings file say now) change them, under the cluster lock.
    The next `provision` or `patch` converges the nodes to them."""
    store = store or Store()
    cluster = load(store, name)
    changes = {k: cluster_settings.check(k, v, "--set") for k, v in (changes or {}).items()}
    if not changes and not record:
        return {"cluster": name, "settings": cluster_settings.recorded(cluster), "changed": []}
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
    return {"cluster": name, "settings": after, "changed": changed}


def inventory(name: str, store: Store | None = None) -> tuple[str, dict[str, Any]]:
    """The cluster's inventory: YAML text (as written to the state dir) and Ansible's JSON form."""
    from gpuprov.ansible.inventory import render, to_json

    store = store or Store()
    cluster = load(store, name)
    provider, files, nodes = refresh(store, cluster)
    context = render(cluster.name, cluster.provider, nodes, expectations(provider, nodes), files)
    return files.inventory.read_text(), to_json(context)


# Converging and probing live beside this module; imported last, as they use the helpers above.
from gpuprov.core.converge import _provision, provision, verify  # noqa: E402
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
