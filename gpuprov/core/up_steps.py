"""The steps of one `up` (and of `patch --onto-image`'s added nodes): the run they share,
what is read before anything is created, the launch, reaching the nodes, the bootstrap, the
health gate and the rollback; gpuprov.core.up strings them together and
gpuprov.core.min_count repeats them for `up --min-count`."""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from typing import Any

from gpuprov import defaults, images
from gpuprov import settings as cluster_settings
from gpuprov.cluster import files_for, kept_alive, load, phase_at_least, without_kept
from gpuprov.console import Console, reporter
from gpuprov.core import counts, health_gate
from gpuprov.core.provision import run_site
from gpuprov.errors import BadInput, PartialLaunch
from gpuprov.health import run as health_run
from gpuprov.lock import stack
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider, facts
from gpuprov.providers import get as get_provider
from gpuprov.pull import controller as pull
from gpuprov.results.shapes import Bootstrap, ImageUsed, UpResult, node_rows
from gpuprov.state import ClusterRecord, NodeRecord, Store


@dataclass
class Run:
    """One `up` under way: what its steps share."""

    spec: ClusterSpec
    provider: Provider
    store: Store
    console: Console
    plan: Plan
    lock: LockData
    existing: ClusterRecord | None
    recorded: dict[str, Any] | None
    rollback: bool = False
    files: ClusterFiles | None = None
    created_record: bool = False
    added: list[NodeRecord] = field(default_factory=list)
    health: str = "quick"  # the health gate's level after the bootstrap (`--health`), or "off"
    tags: list[str] = field(default_factory=list)  # only these plays (`--tags`); all when empty
    image: ImageUsed | None = None  # what new nodes boot from (providers with images)
    mode: str = "push"  # how new nodes bootstrap: push (Ansible from here) or pull (gpuprov.pull)
    pull: pull.Session | None = None  # a pull bootstrap under way
    verify: bool = True  # the probes once bootstrapped and healthy (`--no-verify`: none)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def made_files(self) -> ClusterFiles:
        """The cluster's files (its key, known_hosts), once `record` made them."""
        assert self.files is not None, "the cluster's files are made by record() first"
        return self.files

    def report(self, message: str) -> None:
        reporter(self.console)(message)


# -- before anything is created ---------------------------------------------------------------
def prepare(spec: ClusterSpec, provider: Provider, store: Store, console: Console, *, dry_run: bool = False) -> Run:
    """State, recorded settings, the provider's plan and the version lock: all read-only. A dry
    run where the provider cannot be asked (aws without credentials) plans with what gpuprov
    carries (Provider.unasked_plan): no image is chosen then."""
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
    spec = dataclasses.replace(spec, settings=recorded, stack=spec.stack.checked())
    image = None
    files = files_for(spec.name, create=False)
    plan = provider.unasked_plan(spec) if dry_run else None
    unasked = plan is not None
    if plan is not None:
        lock = resolve_lock(plan.spec, existing, provider)
    elif provider.supports("baked_images"):
        # The lock first: it says which baked image new nodes boot from, which the plan checks.
        lock = resolve_lock(spec, existing, provider)
        spec, image = choose_image(spec, provider, lock)
        plan = provider.plan(spec, files)
    else:
        plan = provider.plan(spec, files)
        lock = resolve_lock(plan.spec, existing, provider)
    if existing is None and plan.existing and not provider.adopts_existing:
        # Resources carry this name but this state directory never made them
        # (another GPUPROV_HOME, or lost state): never adopt or touch them.
        raise BadInput(
            f"{plan.existing} {spec.provider} node(s) labelled with cluster '{spec.name}' already "
            "exist but this state directory does not know them; choose another --name, or "
            f"remove them with `gpuprov down {spec.name}`"
        )
    if spec.scheduler.max_count is not None and provider.powers_from_controller and lock.get("hash") and not unasked:
        # Dynamic nodes that boot from an image baked beforehand (aws): none is one line, nothing made.
        provider.dynamic_image(plan.spec.region, lock["hash"], spec.name, str(plan.spec.instance_type or ""))
    plan = counts.counted(plan, provider, len(kept_alive(provider, existing)))
    return Run(spec=plan.spec, provider=provider, store=store, console=console, plan=plan, lock=lock,
               existing=existing, recorded=recorded, image=image)


def choose_image(spec: ClusterSpec, provider: Provider, lock: LockData) -> tuple[ClusterSpec, ImageUsed]:
    """What new nodes boot from: --image, else the newest image baked for ``lock`` (unless
    --no-baked), else the provider's default. The spec comes back naming it."""
    no_baked = spec.no_baked
    # Listing is what tells whether an --image was baked for another lock; where it costs an API
    # call (aws), an --image is not listed: the plan describes it anyway.
    listed = not (spec.image and provider.images_cost_a_call) and not (no_baked and not spec.image)
    found = provider.baked_images(spec.region) if listed else []
    choice = images.choose(found, lock, explicit=spec.image, no_baked=no_baked, os=spec.os)
    if choice.ref:
        spec = spec.with_options(image=choice.ref)
    return spec, ImageUsed(ref=choice.ref, baked_for=choice.baked.lock_hash if choice.baked else None,
                           reason=choice.reason)


# -- under the cluster lock ------------------------------------------------------------------
def up_result(run: Run, nodes: list[NodeRecord], bootstrap: Bootstrap | None = None) -> UpResult:
    return UpResult(cluster=run.name, provider=run.spec.provider, nodes=node_rows(nodes),
                    bootstrap=bootstrap, image=run.image if run.plan.to_create else None)


def record(run: Run) -> None:
    """A new cluster's state record (its name taken for good); the files' directory."""
    if run.existing is None:
        try:
            run.store.create_cluster(run.name, run.spec.provider, run.spec.as_dict(), lock=run.lock)
        except KeyError:
            raise BadInput(
                f"cluster name '{run.name}' was just taken by another gpuprov "
                "process; choose another --name"
            ) from None
        run.created_record = True
    run.files = files_for(run.name)


def launch(run: Run) -> list[NodeRecord]:
    """The provider's launch; its nodes recorded. A failed launch leaves state as it was,
    except nodes the provider could not remove (kept, so `down` finds them)."""
    store, name, existing = run.store, run.name, run.existing
    assert run.files is not None
    known_ids = {n.id for n in existing.nodes} if existing else set()
    try:
        nodes = without_kept(existing, run.provider.launch(run.plan, run.files, run.report))
    except BaseException as exc:
        leftover = exc.leftover_nodes if isinstance(exc, PartialLaunch) else []
        if leftover:
            store.replace_nodes(name, [*(existing.nodes if existing else ()), *leftover])
            store.set_failed_step(name, "launch")
        elif run.created_record:
            store.delete_cluster(name)
            shutil.rmtree(run.files.dir, ignore_errors=True)
        else:
            store.set_failed_step(name, "launch")
        raise
    run.added = [n for n in nodes if n.id not in known_ids]
    store.replace_nodes(name, nodes)
    if existing is not None and cluster_settings.recorded(existing) is None:
        store.set_spec(name, {**existing.spec, "options": {
            **(existing.spec.get("options") or {}), "settings": run.recorded}})
    # A cluster that gained nodes is only as far as its newest node; one that did not
    # keeps what it reached (re-running `up` goes on from there).
    reach(store, name, "launched", reset=bool(run.added))
    return nodes


def wait_ready(run: Run, nodes: list[NodeRecord]) -> list[NodeRecord]:
    """Every node answers SSH with its pinned host key; else what this run made is undone
    as the rollback rule says, and the failed step recorded."""
    assert run.files is not None
    try:
        nodes = run.provider.wait_ready(run.spec, nodes, run.files, run.report)
    except BaseException:
        if run.created_record and (run.rollback or not run.plan.billable):
            # All or nothing: a new cluster whose nodes never answered is removed.
            run.report("nodes not reachable: removing what this run launched")
            rollback(run, nodes, whole=True)
        else:
            if run.rollback:
                rollback(run, nodes)
            if run.store.get_cluster(run.name) is not None:
                run.store.set_failed_step(run.name, "reach")
        raise
    run.store.replace_nodes(run.name, nodes)
    if run.created_record and run.provider.pins_without_bootstrap:
        relock_from_hosts(run, nodes)
    reach(run.store, run.name, "reachable", reset=bool(run.added))
    return nodes


def relock_from_hosts(run: Run, nodes: list[NodeRecord]) -> None:
    """Hosts that already exist: their PCI buses now say what they are (NVSwitch functions
    mean fabric manager, whatever was declared)."""
    try:
        seen = resolve_lock(run.spec, None, run.provider, nodes)
    except BadInput:
        rollback(run, nodes, whole=True)
        raise
    if seen["hash"] != run.lock["hash"]:
        run.console.say(f"  stack from the hosts' PCI buses: {seen['instance_type']}: driver "
                        f"{seen['driver']}, fabric manager {seen['fabricmanager'] or 'none'} "
                        f"[lock {seen['hash']}]")
        run.store.set_lock(run.name, seen)


def bootstrap_nodes(run: Run, nodes: list[NodeRecord]) -> UpResult:
    """The playbooks, unless the cluster got that far already and gained no node."""
    assert run.files is not None
    cluster = load(run.store, run.name)
    if not run.added and phase_at_least(cluster, "bootstrapped"):
        run.console.say(f"{run.name}: already {cluster.state}; nothing to resume "
                        f"(`gpuprov provision {run.name}` converges again)")
        return up_result(run, nodes, Bootstrap(ok=True, hosts={}, errors={}, resumed_from=cluster.state))
    # A cluster that existed before this run (grown, or resumed after a stop) converges in the
    # size of the change, as `provision` does: its nodes whose manifest holds for the same
    # inputs run no play, the new ones (no manifest) run the whole site.
    try:
        outcome = pull.bootstrap(run, cluster, nodes, push=run_site) if run.mode == "pull" else run_site(
            run.store, cluster, run.provider, run.files, nodes, console=run.console, tags=run.tags or None,
            use_manifest=run.existing is not None, say_next=not run.verify)
    except BaseException:
        if run.rollback:
            rollback(run, nodes, whole=run.created_record)
        raise
    if not outcome.ok and run.rollback:
        run.report("bootstrap failed and --rollback is on: removing what this run launched")
        nodes = rollback(run, nodes, whole=run.created_record)
    return up_result(run, nodes, Bootstrap.of(outcome, run.pull.report if run.pull else None))


def check_health(run: Run, result: UpResult) -> UpResult:
    """The health checks (``--health``) on the bootstrapped nodes, recorded as a health run
    (`gpuprov status` shows it). Each failing check is named with its node and action."""
    if run.health == health_gate.OFF or result.bootstrap is None or not result.bootstrap.ok or not result.nodes:
        return result
    checked = health_run.cluster_health(run.name, console=run.console, level=run.health, store=run.store)
    for row in health_gate.failures(checked.checks):
        run.console.say(f"{run.name}: not ready: {row.node}: health {health_gate.line(row)}")
    return dataclasses.replace(result, health=checked)


def reach(store: Store, name: str, phase: str, *, reset: bool = False) -> None:
    """Record that ``name`` reached ``phase``: never moves a cluster back unless ``reset``."""
    cluster = store.get_cluster(name)
    if cluster is None:
        return
    if reset or not phase_at_least(cluster, phase):
        store.set_cluster_state(name, phase)
    elif cluster.failed_step:
        store.set_failed_step(name, None)


def rollback(run: Run, nodes: list[NodeRecord], *, whole: bool = False) -> list[NodeRecord]:
    """Undo one ``up``: the whole cluster when it made it, else only the nodes it added
    (where the provider can remove single nodes). Returns the nodes that remain."""
    assert run.files is not None
    if whole:
        run.provider.terminate(run.name, nodes, run.files, run.report)
        run.store.delete_cluster(run.name)
        shutil.rmtree(run.files.dir, ignore_errors=True)
        return []
    if not run.provider.supports("terminate_nodes") or not run.added:
        return nodes
    run.report(f"removing the {len(run.added)} node(s) this run added: {', '.join(n.name for n in run.added)}")
    gone = {n.id for n in run.added} - set(run.provider.terminate_nodes(run.added, run.files, run.report))
    kept = [n for n in nodes if n.id not in gone]
    run.store.replace_nodes(run.name, kept)
    return kept


# -- the version lock and the plan, in words --------------------------------------------------
def resolve_lock(spec: ClusterSpec, existing: ClusterRecord | None,
                 provider: Provider | None = None,
                 nodes: list[NodeRecord] | None = None) -> LockData:
    """The version lock for a new cluster (refused with its rule when impossible), or the one
    an existing cluster already has; a different request for an existing cluster is refused."""
    choice = spec.stack.checked()
    asked = choice.asked()
    if existing is not None and existing.lock:
        lock = existing.lock
        # Locks stored before the kernel_module field installed the proprietary modules.
        held = {**lock, "kernel_module": lock.get("kernel_module") or "proprietary",
                "gpu_sharing": lock.get("gpu_sharing") or "none"}
        moved = {k: v for k, v in asked.items()
                 if not (v == held.get(k) or (k == "driver" and v == lock.get("driver_branch")))}
        if moved:
            raise BadInput(
                f"cluster '{spec.name}' is locked to driver {lock['driver']} ({lock['source']}), "
                f"CUDA {lock['cuda']}, GPU sharing {held['gpu_sharing']}; it does not change on `up` "
                f"({', '.join(sorted(moved))} asked; `gpuprov patch` moves them)"
            )
        return lock
    # Cloud nodes use NVIDIA's repositories, local Debian nodes Debian's (the registry's facts).
    source = asked.get("source") or facts(spec.provider).package_source
    if source == "mirror" and not (choice.mirror_url and choice.mirror_key_fingerprint):
        raise BadInput("--source mirror needs --mirror-url and --mirror-key-fingerprint "
                       "(the mirror's signing key, 40 hex digits)")
    # What the hosts are: the requested type, or (static hosts) each host's declared type or
    # GPU count and, once reached, what its PCI bus showed.
    kinds = (provider or get_provider(spec.provider)).host_types(spec, nodes)
    return stack.resolve_types(
        kinds or [],
        cuda=asked.get("cuda"),  # None: the OS's default line (11.8; Debian 13's own 12.4)
        os=spec.os if spec.os in defaults.LOCK_OS else None,
        driver=asked.get("driver"),
        source=source,
        kernel_module=asked.get("kernel_module"),
        gpu_sharing=asked.get("gpu_sharing"),
        label=spec.instance_type if kinds and len({k.name for k in kinds}) == 1 and spec.instance_type
        else None,
    ).as_dict()
