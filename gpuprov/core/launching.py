"""`up`: check, plan, launch, reach, bootstrap, health; each step a function of one run."""

from __future__ import annotations

from collections.abc import Callable

from gpuprov.ansible.runner import parse_tags
from gpuprov.core import health_gate, replacing
from gpuprov.core.plan_words import show_plan
from gpuprov.core.up_steps import Run, check_health, launch, prepare, record, up_result, wait_ready
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterSpec, Plan, Provider
from gpuprov.providers import get as get_provider
from gpuprov.pull import controller as pull
from gpuprov.shared.cluster import cluster_lock, validate_name
from gpuprov.shared.console import Console
from gpuprov.shared.results import UpResult
from gpuprov.state import Store

__all__ = ["Run", "check_health", "checked", "launch_and_bootstrap", "up"]


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
    health: str = "quick",
    tags: str | None = None,
    mode: str = "auto",
) -> UpResult:
    """Launch (or complete) a cluster and bootstrap it.

    ``rollback``: when the nodes never answer SSH or the bootstrap fails,
    terminate what this run launched. ``None`` means: on for a new cluster of a
    billable provider, off otherwise (free local nodes are kept to look at).
    Failures inside the provider's launch always undo what it made.

    ``health``: the health checks' level once the bootstrap went through (``off``: none);
    a failing check leaves the cluster as it is and the result not ok (exit 1).

    ``tags``: bootstrap with only these plays (``provision --tags``); checked before anything
    is created, and the cluster stays short of ``bootstrapped``.

    ``mode``: push, pull (the new nodes bootstrap themselves: gpuprov.pull) or auto.
    """
    health = health_gate.level(health)
    tag_list = parse_tags(tags)
    if tag_list and not bootstrap:
        raise BadInput("--tags chooses the bootstrap's plays; it cannot go with --no-bootstrap")
    provider, spec = checked(spec)
    run = prepare(spec, provider, store or Store(), console)
    run.health, run.tags = health, tag_list
    run.mode = pull.mode_for(mode, provider, spec, bootstrap)
    if name_generated:
        console.say(f"cluster name: {spec.name} (generated; pass it to verify, provision, down)")
    show_plan(run.plan, run.lock, console, provider)
    if run.mode == "pull":
        console.say("  bootstrap: pull (each new node fetches a bundle served from here, checks it, "
                    "bootstraps and verifies itself)")
    if run.image is not None and run.plan.to_create:
        console.say(f"  image: {run.image.reason}")
    if dry_run:
        provider.dry_run(run.plan, run.report)
        return UpResult(cluster=spec.name, provider=spec.provider, nodes=[], bootstrap=None, dry_run=True,
                        image=run.image if run.plan.to_create else None)
    if run.plan.billable and run.plan.to_create and confirm is not None and not confirm(run.plan):
        raise GpuprovError("aborted; nothing was created")
    run.rollback = (run.existing is None and run.plan.billable) if rollback is None else rollback
    with cluster_lock(spec.name):
        return launch_and_bootstrap(run, bootstrap)


# -- before anything is created ---------------------------------------------------------------
def checked(spec: ClusterSpec) -> tuple[Provider, ClusterSpec]:
    """The provider and the request as it checked it (its defaults filled in); BadInput else."""
    validate_name(spec.name)
    provider = get_provider(spec.provider)
    return provider, provider.check_spec(spec)


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
        return replacing.bootstrap(run, nodes)  # with --min-count: failures set aside and replaced


