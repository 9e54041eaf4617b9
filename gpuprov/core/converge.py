"""Converge and probe a cluster's nodes: `provision` (site.yml through ansible-runner) and
`verify` (the testinfra probes), and the bootstrap step of `up`."""

from __future__ import annotations

import json
from typing import Any

from gpuprov import paths
from gpuprov.core import (
    Console,
    cluster_lock,
    expectations,
    load,
    phase_at_least,
    reachable_nodes,
    refresh,
    version_lock,
)
from gpuprov.core.settings import play_secrets, playbook_vars
from gpuprov.providers import ClusterFiles, Provider
from gpuprov.state import ClusterRecord, NodeRecord, Store

# The one row an unreachable node gets in `verify`, instead of a failure per probe.
REACHABLE_PROBE = "reachable"


def check_reachable(
    files: ClusterFiles, nodes: list[NodeRecord], console: Console
) -> tuple[list[NodeRecord], dict[str, str]]:
    """One SSH check per node (in parallel, pinned host keys): the nodes that answer, and
    {node: why not} for the others, each reported here in one line."""
    from gpuprov.ssh import unreachable_nodes

    down = unreachable_nodes(nodes, files.key, files.known_hosts)
    for node in nodes:
        if node.name in down:
            console.say(f"  {node.name}: UNREACHABLE {down[node.name]}")
    return [n for n in nodes if n.name not in down], down


def unreachable_stats() -> dict[str, int]:
    """A provision host entry for a node that was not reached: nothing ran there."""
    return {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "tasks": 0}


def unreachable_row(why: str) -> dict[str, str]:
    return {"probe": REACHABLE_PROBE, "status": "fail", "detail": f"unreachable: {why}"}


# -- provision --------------------------------------------------------------------------
def provision(
    name: str, *, console: Console, store: Store | None = None, check: bool = False, tags: str | None = None
) -> dict[str, Any]:
    from gpuprov.ansible.runner import parse_tags

    tag_list = parse_tags(tags)
    store = store or Store()
    cluster = load(store, name)
    with cluster_lock(name):
        provider, files, nodes = refresh(store, cluster)
        nodes = reachable_nodes(cluster, nodes)
        return _provision(store, cluster, provider, files, nodes, console=console, check=check,
                          tags=tag_list)


def _provision(
    store: Store,
    cluster: ClusterRecord,
    provider: Provider,
    files: ClusterFiles,
    nodes: list[NodeRecord],
    *,
    console: Console,
    check: bool = False,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    from gpuprov.ansible.inventory import render
    from gpuprov.ansible.runner import new_run_dir, run_playbook

    lock = version_lock(store, cluster)
    render(cluster.name, cluster.provider, nodes, expectations(provider, nodes, lock), files)
    extravars = playbook_vars(cluster, lock)
    # The same variables, for running the playbooks by hand (-e @vars.json).
    (files.dir / "vars.json").write_text(json.dumps(extravars, indent=2) + "\n")
    kind = "provision-check" if check else "provision"
    run_dir = new_run_dir(files, kind)
    run_id = store.start_run(cluster.name, kind, str(run_dir))
    ok = False
    summary: dict[str, Any] = {}
    hosts: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    result = None
    try:
        # Each node is checked once; an unreachable one is reported once and left out of the
        # play (--limit), and the others are still served.
        reachable, down = check_reachable(files, nodes, console)
        errors = {host: f"unreachable: {why}" for host, why in down.items()}
        if reachable:
            result = run_playbook(
                paths.playbooks_dir() / "site.yml",
                files,
                [n.name for n in reachable],
                run_dir,
                title=f"{'check' if check else 'provision'} {cluster.name}",
                check=check,
                tags=tags or (),
                limit=[n.name for n in reachable] if down else (),
                extravars=extravars,
                secrets=play_secrets(),
                console=console.rich,
            )
            errors |= result.errors
        played = result.hosts if result is not None else {}
        hosts = {n.name: unreachable_stats() if n.name in down else played.get(n.name, unreachable_stats())
                 for n in nodes}
        ok = not down and result is not None and result.ok
        summary = {"hosts": hosts, "errors": errors}
    finally:
        store.finish_run(run_id, ok, summary)
    if not check and ok and not tags:
        store.set_cluster_state(cluster.name, "bootstrapped")
    elif not check and not ok:
        store.set_failed_step(cluster.name, "bootstrap")
    if result is not None and console.rich.is_terminal:
        # The live table shows counts only: say what went wrong, once per node. (Elsewhere the
        # progress has already printed each failure as its own line.)
        for host, error in result.errors.items():
            console.say(f"  {host}: {error}")
    console.say(f"  artifacts: {result.artifact_dir if result is not None else run_dir}")
    return {"cluster": cluster.name, "ok": ok, "hosts": hosts}


# -- verify --------------------------------------------------------------------------------
def verify(
    name: str, *, console: Console, store: Store | None = None, level: str = "quick"
) -> dict[str, Any]:
    from gpuprov.ansible.inventory import render
    from gpuprov.ansible.runner import new_run_dir
    from gpuprov.probes.run import run_probes

    store = store or Store()
    cluster = load(store, name)
    provider, files, nodes = refresh(store, cluster)
    nodes = reachable_nodes(cluster, nodes)
    expect = expectations(provider, nodes, version_lock(store, cluster))
    render(cluster.name, cluster.provider, nodes, expect, files)
    run_dir = new_run_dir(files, f"verify-{level}")
    run_id = store.start_run(cluster.name, f"verify-{level}", str(run_dir))
    ok = False
    summary = {"pass": 0, "fail": 0, "skip": 0}
    hosts: dict[str, list[dict[str, str]]] = {}
    try:
        # Each node is checked once: an unreachable one is one failed row with the SSH
        # error, not a failure per probe; the probes run on the nodes that answer.
        reachable, down = check_reachable(files, nodes, console)
        probed = {}
        if reachable:
            probed = run_probes(
                files.inventory,
                files.ansible_cfg,
                [n.name for n in reachable],
                expect,
                run_dir,
                level=level,
                console=console.rich,
            )
        hosts = {n.name: [unreachable_row(down[n.name])] if n.name in down else probed.get(n.name, [])
                 for n in nodes}
        hosts |= {h: rows for h, rows in probed.items() if h not in hosts}
        for results in hosts.values():
            for r in results:
                summary[r["status"]] += 1
        ok = summary["fail"] == 0 and all(hosts.get(n.name) for n in nodes)
    finally:
        store.finish_run(run_id, ok, summary)
    if ok and phase_at_least(cluster, "bootstrapped"):
        store.set_cluster_state(name, "verified")
    elif not ok:
        store.set_failed_step(name, "verify")
    return {"cluster": name, "ok": ok, "hosts": hosts, "summary": summary}
