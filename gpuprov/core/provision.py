"""`provision`: converge a cluster's nodes (site.yml through ansible-runner); also the bootstrap
step of `up` and of `patch --onto-image` (``run_site``). Its probes are gpuprov.core.verify's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.ansible import runner
from gpuprov.ansible.inventory import render
from gpuprov.ansible.runner import new_run_dir, parse_tags, write_extravars
from gpuprov.cluster import (
    check_reachable,
    cluster_lock,
    expectations,
    load,
    reachable_nodes,
    refresh,
    version_lock,
)
from gpuprov.console import Console
from gpuprov.core import elastic
from gpuprov.core.monitoring import monitoring_host
from gpuprov.errors import BadInput
from gpuprov.health import node_bundle
from gpuprov.manifest import record as manifest_record
from gpuprov.manifest import steps as manifests
from gpuprov.providers import ClusterFiles, Provider
from gpuprov.providers import get as get_provider
from gpuprov.results.shapes import UNREACHED, HostStats, ProvisionResult, serialise
from gpuprov.settings import play_secrets, playbook_vars
from gpuprov.slurm import scheduler
from gpuprov.slurm.scheduler_choice import Replacement
from gpuprov.state import ClusterRecord, NodeRecord, Store


def provision(
    name: str, *, console: Console, store: Store | None = None, check: bool = False, tags: str | None = None,
    scheduler_choice: scheduler.Scheduler | None = None, full: bool = False, via: str = "push",
    max_count: int | None = None, idle_minutes: int | None = None, accounting: bool | None = None,
    replace: Replacement | bool | None = None,
) -> ProvisionResult:
    """site.yml on every node that answers and whose manifest does not hold (``full``: on every
    node, as `up` runs it). ``scheduler_choice``: give the cluster this scheduler first
    (recorded before the run; with ``check`` nothing is recorded, and the run plans the cluster
    as its record is). ``via``: push (Ansible from here) or pull (the nodes run it themselves:
    gpuprov.core.via_pull). ``max_count``/``idle_minutes``: give a Slurm cluster dynamic nodes
    (gpuprov.core.elastic), kept as recorded where not given; ``accounting`` likewise turns
    Slurm's accounting on or off (gpuprov.slurm.accounting); ``replace`` turns
    `--replace-unhealthy` on (a Replacement: converging this run's ``tags``) or off (False)."""
    tag_list = parse_tags(tags)
    if isinstance(replace, Replacement):
        replace = dataclasses.replace(replace, plays=tuple(tag_list))
    store = store or Store()
    cluster = load(store, name)
    scheduler_choice = elastic.merged(scheduler.of(cluster), scheduler_choice, max_count, idle_minutes, accounting,
                                      replace)
    if scheduler_choice is not None:
        scheduler_choice.checked()
        scheduler.controller_of(cluster, scheduler_choice)  # a controller that is no node: refused now
        chosen_provider = get_provider(cluster.provider)
        dynamic = elastic.check(scheduler_choice, len(cluster.nodes), chosen_provider)
        if dynamic is not None and via == "pull":
            raise BadInput("--max-count: dynamic nodes are set up by push (`--via push`)")
        if dynamic is not None and chosen_provider.powers_from_controller and not check:
            # aws: the image they boot from exists, before anything is recorded or made.
            region = next((str(n.extra["region"]) for n in cluster.nodes if n.extra.get("region")),
                          cluster.spec.get("region"))
            like = next(n for n in cluster.nodes if n.name == scheduler.template_node(cluster, scheduler_choice))
            chosen_provider.dynamic_image(region, str((cluster.lock or {}).get("hash") or ""), cluster.name,
                                          like.instance_type)
    with cluster_lock(name):
        cluster = load(store, name)
        provider, files, nodes = refresh(store, cluster)
        nodes = reachable_nodes(cluster, nodes)
        if via == "pull":
            from gpuprov.core import via_pull  # lazy: CLI start-up

            return via_pull.converge(store, cluster, provider, files, nodes, console=console, tags=tag_list,
                                     use_manifest=not full)
        # A node whose slurm.conf serves another cluster: refused before the choice is recorded.
        if scheduler.would_configure(cluster, nodes, scheduler_choice, tag_list):
            scheduler.refuse_foreign(cluster, files, nodes)
        if scheduler_choice is not None and not check:
            cluster = scheduler.record(store, load(store, name), scheduler_choice)
        return run_site(store, cluster, provider, files, nodes, console=console, check=check,
                        tags=tag_list, slurm_checked=True, use_manifest=not full)


def _elastic_before(cluster: ClusterRecord, provider: Provider, files: ClusterFiles, nodes: list[NodeRecord],
                    console: Console, check: bool, tags: list[str] | None, slurm_checked: bool) -> None:
    """Before a run that configures Slurm: a node whose slurm.conf serves another cluster
    refused (unless the caller did); on a cluster with dynamic nodes, its power service running
    (the controller's power configuration names its URL): here, or on aws the cluster's set-up
    for the service the play installs on the controller (gpuprov.slurm.power_aws_bundle.set_up). A check
    starts and makes nothing."""
    if not slurm_checked and scheduler.would_configure(cluster, nodes, tags=tags):
        scheduler.refuse_foreign(cluster, files, nodes)
    if not check and scheduler.of(cluster).max_count is not None and scheduler.would_configure(cluster, nodes,
                                                                                             tags=tags):
        if provider.powers_from_controller:
            from gpuprov.slurm import power_aws_bundle  # lazy: CLI start-up

            power_aws_bundle.set_up(cluster, provider, files, nodes, console.say)
        else:
            elastic.ensure_service(cluster, files, console)


def _elastic_after(store: Store, cluster: ClusterRecord, provider: Provider, files: ClusterFiles,
                   console: Console, *, done: bool, extravars: dict[str, Any]) -> None:
    """After a run that configured Slurm on such a cluster (``done``: it succeeded, for real):
    the image its dynamic nodes boot from, baked for its lock where there is none; protected
    mode ended (the partitions UP, the nodes failed resumes set DOWN back in service)."""
    if done and extravars.get("gpuprov_slurm_dynamic_nodes"):
        now = load(store, cluster.name)
        elastic.ensure_image(store, now, provider, files, console)
        elastic.end_protection(now, files, console)


def run_site(
    store: Store,
    cluster: ClusterRecord,
    provider: Provider,
    files: ClusterFiles,
    nodes: list[NodeRecord],
    *,
    console: Console,
    check: bool = False,
    tags: list[str] | None = None,
    slurm_checked: bool = False,
    use_manifest: bool = False,
    say_next: bool = True,
) -> ProvisionResult:
    """Run site.yml (every play, or only ``tags``) on ``nodes`` of ``cluster`` under its version
    lock: the inventory and the run's variables written, the run recorded with its artifacts, an
    unreachable node reported once and left out. A full run that succeeds marks the cluster
    bootstrapped; one that fails records the failed step. ``check``: Ansible's --check --diff
    (nothing changes, nothing is marked). `provision`, `up`, `patch --onto-image` and a pull
    bootstrap's push fallback all converge through here. A run that configures Slurm refuses a
    node whose slurm.conf serves another cluster (unless ``slurm_checked``: the caller did) and
    keeps dynamic nodes' power service and image (gpuprov.core.elastic).

    Manifests (gpuprov.manifest): after a run of every play that succeeds (not ``check``), each
    node it ran on records what the plays manage there; with ``use_manifest`` (`provision`
    without --full or --tags) a node whose manifest holds, for the same inputs, gets no Ansible
    run. A run of some plays (``tags``) reads and writes none, as before manifests."""
    _elastic_before(cluster, provider, files, nodes, console, check, tags, slurm_checked)
    lock = version_lock(store, cluster)
    context = render(cluster.name, cluster.provider, nodes, expectations(provider, nodes, lock), files,
                     monitoring_host(cluster.spec))
    network = provider.network_nodes(nodes, console.say) if scheduler.of(cluster).kind == "slurm" else {}
    extravars = playbook_vars(cluster, lock) | scheduler.play_vars(cluster, files, nodes, console.say, network)
    if extravars.get("gpuprov_scheduler") == "slurm":
        # Slurm's HealthCheckProgram runs `gpuprov health`'s quick level on each node, held to
        # what `gpuprov health NAME` holds it to.
        extravars |= node_bundle.play_vars(files.dir, node_bundle.expectations(cluster.name, provider, nodes, lock))
    # The same variables, for running the playbooks by hand (-e @vars.yml): as data, every
    # string tagged !unsafe like the run's own (a JSON file would be read as trusted template
    # source). A vars.json an older gpuprov wrote is removed so nobody runs it by mistake.
    write_extravars(files.dir / "vars.yml", extravars)
    (files.dir / "vars.json").unlink(missing_ok=True)
    # A run of some plays (--tags) reads no manifest and writes none: a manifest covers the site.
    whole = not tags
    scope, inputs = manifests.inputs_of(context, extravars, tags)
    verdicts = manifests.verdicts(cluster, files, nodes, inputs, scope) if use_manifest and whole else {}
    to_run = manifests.to_run(nodes, verdicts, slurm=extravars.get("gpuprov_scheduler") == "slurm",
                              say=console.say)
    kind = "provision-check" if check else "provision"
    run_dir = new_run_dir(files, kind)
    run_id = store.start_run(cluster.name, kind, str(run_dir))
    ok, summary = False, {}
    # A node that held no manifest before this run (new, or never converged whole) was never
    # proven by verify: the cluster does not stay verified through its run, changed or not.
    unproven = [n.name for n in to_run if n.name not in manifest_record.records(cluster)]
    try:
        if not check and whole:
            manifests.forget(store, cluster.name, to_run)
        outcome, artifacts = _site(cluster.name, files, to_run, run_dir, extravars, console=console,
                                   check=check, tags=tags, partial=len(to_run) < len(nodes))
        if not check and whole and outcome.ok and to_run:
            manifests.record_run(store, cluster.name, files, to_run, artifacts, inputs, scope, say=console.say)
        outcome = manifests.merged(outcome, nodes, verdicts)
        ok, summary = outcome.ok, serialise({"hosts": outcome.hosts, "errors": outcome.errors,
                                             **({"manifest": outcome.manifest} if verdicts else {})})
    finally:
        store.finish_run(run_id, ok, summary)
    if not check and ok and not tags:
        changed = any(h.changed for h in outcome.hosts.values())
        # A run that changed nothing leaves a verified cluster verified (what verify proved
        # still holds); one that changed something is bootstrapped until verify runs again.
        if changed or unproven or cluster.state != "verified":
            store.set_cluster_state(cluster.name, "bootstrapped")
        if (changed or unproven) and say_next:
            console.say(f"  next: gpuprov verify {cluster.name} (the nodes changed since their probes ran)")
    elif not check and not ok:
        store.set_failed_step(cluster.name, "bootstrap")
    _elastic_after(store, cluster, provider, files, console, done=not check and ok, extravars=extravars)
    console.say(f"  artifacts: {artifacts.artifact_dir if artifacts is not None else run_dir}")
    return outcome


def _site(name: str, files: ClusterFiles, nodes: list[NodeRecord], run_dir: Path,
          extravars: dict[str, Any], *, console: Console, check: bool,
          tags: list[str] | None, partial: bool = False) -> tuple[ProvisionResult, Any]:
    """site.yml on the nodes that answer SSH: each is checked once; an unreachable one is
    reported once and left out of the play (--limit), and the others are still served.
    ``partial``: ``nodes`` are some of the inventory's (--limit them). The result, and the
    playbook's result (None: no play ran, and the artifacts are ``run_dir``)."""
    if not nodes:
        return ProvisionResult(cluster=name, ok=True, hosts={}, errors={}), None
    reachable, down = check_reachable(files, nodes, console)
    errors = {host: f"unreachable: {why}" for host, why in down.items()}
    result = None
    if reachable:
        result = runner.run_playbook(
            paths.playbooks_dir() / "site.yml",
            files,
            [n.name for n in reachable],
            run_dir,
            title=f"{'check' if check else 'provision'} {name}",
            check=check,
            tags=tags or (),
            limit=[n.name for n in reachable] if down or partial else (),
            extravars=extravars,
            secrets=play_secrets(),
            console=console.rich,
        )
        errors |= result.errors
        if console.rich.is_terminal:
            # The live table shows counts only: say what went wrong, once per node. (Elsewhere
            # the progress has already printed each failure as its own line.)
            for host, error in result.errors.items():
                console.say(f"  {host}: {error}")
    played = result.hosts if result is not None else {}
    hosts = {n.name: UNREACHED if n.name in down or n.name not in played else HostStats.of(played[n.name])
             for n in nodes}
    ok = not down and result is not None and result.ok
    would = (result.would_change or None) if check and result is not None else None
    return ProvisionResult(cluster=name, ok=ok, hosts=hosts, errors=errors, would_change=would), result
