"""`up`: check, plan, launch, reach, bootstrap, health, probes; each step a function of one run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from gpuprov.ansible.runner import parse_tags
from gpuprov.cluster import cluster_lock, validate_name
from gpuprov.console import Console
from gpuprov.core import counts, elastic, health_gate, min_count, up_verdict
from gpuprov.core.plan_words import plan_cost, show_plan
from gpuprov.core.up_steps import Run, check_health, launch, prepare, record, up_result, wait_ready
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterSpec, Plan, Provider
from gpuprov.providers import get as get_provider
from gpuprov.pull import controller as pull
from gpuprov.pull.mode import mode_for
from gpuprov.results.shapes import UpResult
from gpuprov.slurm import scheduler
from gpuprov.slurm.scheduler_choice import Replacement, Scheduler
from gpuprov.state import ClusterRecord, Store

__all__ = ["Run", "UpRequest", "check_health", "checked", "launch_and_bootstrap", "up"]


@dataclass(frozen=True)
class UpRequest:
    """One `gpuprov up`, typed and frozen, built once from the command line.

    ``spec``: the cluster asked for (its provider's own options, the version lock's choices,
    the counts). ``bootstrap``: run the playbooks (else launch and, for hosts that exist, pin
    and reach them). ``rollback``: when the nodes never answer SSH or the bootstrap fails,
    terminate what this run launched; None: on for a new cluster of a billable provider, off
    otherwise (free local nodes are kept to look at); failures inside the provider's launch
    always undo what it made. ``health``: the health gate's level once bootstrapped (``off``:
    none). ``tags``: bootstrap with only these plays (the cluster stays short of
    ``bootstrapped``). ``mode``: push, pull (gpuprov.pull) or auto. ``dry_run``: check and show
    the plan, create nothing. ``name_generated``: say the generated name. ``verify``: the probes
    once bootstrapped and healthy, before the cluster is called ready (gpuprov.core.up_verdict)."""

    spec: ClusterSpec
    bootstrap: bool = True
    rollback: bool | None = None
    health: str = "quick"
    tags: str | None = None
    mode: str = "auto"
    dry_run: bool = False
    name_generated: bool = False
    verify: bool = True


def up(request: UpRequest, *, console: Console, store: Store | None = None,
       confirm: Callable[[Plan], bool] | None = None) -> UpResult:
    """Launch (or complete) a cluster and bootstrap it. Everything the request says is checked
    before anything is created; the plan is made under the cluster's lock (another command on
    the same cluster cannot change what it counted), except a dry run's, which writes nothing."""
    health = health_gate.level(request.health)
    tag_list = parse_tags(request.tags)
    if tag_list and not request.bootstrap:
        raise BadInput("--tags chooses the bootstrap's plays; it cannot go with --no-bootstrap")
    if request.spec.scheduler.replace is not None:  # a replacement converges this run's plays, at its health
        request = dataclasses.replace(request, spec=dataclasses.replace(request.spec, scheduler=dataclasses.replace(
            request.spec.scheduler, replace=Replacement(plays=tuple(tag_list), health=health))))
    provider, spec = checked(request.spec)
    # Slurm is converged by push (its munge key never travels in a pull bundle): auto pushes,
    # and pull is refused for it.
    slurm = spec.scheduler.kind == "slurm"
    if slurm and request.mode == "pull":
        raise BadInput("--scheduler slurm is set up by push (the cluster's munge key never travels in a pull "
                       "bundle): use --bootstrap push, or `gpuprov provision NAME --scheduler slurm` after a pull")
    mode = mode_for("push" if slurm else request.mode, provider, spec, request.bootstrap)
    store = store or Store()
    keeps_its_scheduler(store.get_cluster(spec.name), spec.scheduler)
    if request.dry_run:
        run = _planned(request, spec, provider, store, console, health, tag_list, mode)
        # A pull run's plan says so (Plan.pull): the provider's dry run asks about its channel too (aws: S3).
        provider.dry_run(dataclasses.replace(run.plan, pull=True) if mode == "pull" else run.plan, run.report)
        return UpResult(cluster=spec.name, provider=spec.provider, nodes=[], bootstrap=None, dry_run=True,
                        image=run.image if run.plan.to_create else None, cost=plan_cost(run.plan))
    with cluster_lock(spec.name):
        run = _planned(request, spec, provider, store, console, health, tag_list, mode)
        if run.plan.billable and run.plan.to_create and confirm is not None and not confirm(run.plan):
            raise GpuprovError("aborted; nothing was created")
        run.rollback = (run.existing is None and run.plan.billable) if request.rollback is None else request.rollback
        return launch_and_bootstrap(run, request.bootstrap)


def _planned(request: UpRequest, spec: ClusterSpec, provider: Provider, store: Store, console: Console,
             health: str, tags: list[str], mode: str) -> Run:
    """The run's plan (read-only), shown."""
    run = prepare(spec, provider, store, console, dry_run=request.dry_run)
    run.health, run.tags, run.mode, run.verify = health, tags, mode, request.verify
    if mode == "pull" and not request.dry_run and provider.supports("pull_channel"):
        # Before the plan is shown, the record and the launch: a channel that cannot serve (a
        # pull_bucket setting naming a missing bucket) stops here, nothing made or billed. (A
        # dry run asks the same of it among its checks.)
        provider.pull_channel_check(run.spec, console.say)
    if request.name_generated:
        console.say(f"cluster name: {spec.name} (generated; pass it to verify, provision, down)")
    show_plan(run.plan, run.lock, console, provider)
    if run.mode == "pull":
        console.say("  bootstrap: pull (each new node fetches a bundle served from here, or through the "
                    "provider's object store, checks it, bootstraps and verifies itself)")
    if run.image is not None and run.plan.to_create:
        console.say(f"  image: {run.image.reason}")
    return run


# -- before anything is created ---------------------------------------------------------------
def keeps_its_scheduler(existing: ClusterRecord | None, chosen: Scheduler) -> None:
    """`up` of a cluster that exists grows or completes it with its recorded scheduler: a
    scheduler flag that would change that record (--scheduler slurm, the controller, the
    accounting, --max-count, --idle-minutes, --replace-unhealthy) is refused (one line, naming
    the `provision` that changes it), never silently left unapplied."""
    if existing is None:
        return
    recorded = scheduler.of(existing)
    asked = {"--max-count": (chosen.max_count, recorded.max_count),
             "--idle-minutes": (chosen.idle_minutes, recorded.idle_minutes),
             "--replace-unhealthy": (chosen.replace, recorded.replace),
             "--slurm-controller": (chosen.controller, recorded.controller),
             "--slurm-dbd": (chosen.dbd, recorded.dbd)}
    changed = [flag for flag, (given, was) in asked.items() if given is not None and given != was]
    # The flags whose default cannot be told from a value given: only the value that is no default.
    changed += [flag for flag, differs in (
        ("--scheduler", chosen.kind == "slurm" and recorded.kind != "slurm"),
        ("--slurm-controller-only", chosen.controller_only and not recorded.controller_only),
        ("--no-accounting", not chosen.accounting and recorded.kind == "slurm" and recorded.accounting)) if differs]
    if changed:
        raise BadInput(f"cluster '{existing.name}' exists, and `up` keeps its recorded scheduler: "
                       f"{', '.join(changed)} would change it (`gpuprov provision {existing.name} {changed[0]} ...` "
                       "does; with --replace-unhealthy, --tags there are the plays a replacement runs)")


def checked(spec: ClusterSpec) -> tuple[Provider, ClusterSpec]:
    """The provider and the request as it checked it (its defaults filled in); BadInput else."""
    validate_name(spec.name)
    provider = get_provider(spec.provider)
    counts.check_request(spec, provider)
    spec.scheduler.checked()
    spec = provider.check_spec(spec)
    elastic.check(spec.scheduler, spec.count or 0, provider)
    return provider, spec


# -- under the cluster lock ------------------------------------------------------------------
def launch_and_bootstrap(run: Run, bootstrap: bool) -> UpResult:
    record(run)
    with pull.serving(run):  # pull mode: the bundle served from before the launch
        nodes = launch(run)
        if not bootstrap and not run.provider.pins_without_bootstrap:
            run.console.say(
                f"{run.name}: {len(nodes)} node(s) running (--no-bootstrap: no SSH wait, no playbooks)"
            )
            return up_result(run, nodes)
        nodes = wait_ready(run, nodes)
        if not bootstrap:
            run.console.say(f"{run.name}: {len(nodes)} node(s) reachable with pinned host keys "
                            "(--no-bootstrap: no playbooks)")
            return up_result(run, nodes)
        # with --min-count: failures set aside and replaced; then the probes and the verdict
        return up_verdict.finish(run, min_count.bootstrap(run, nodes))


