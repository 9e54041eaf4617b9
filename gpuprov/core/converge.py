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
    try:
        result = run_playbook(
            paths.playbooks_dir() / "site.yml",
            files,
            [n.name for n in nodes],
            run_dir,
            title=f"{'check' if check else 'provision'} {cluster.name}",
            check=check,
            tags=tags or (),
            extravars=extravars,
            secrets=play_secrets(),
            console=console.rich,
        )
        ok = result.ok
        summary = {"hosts": result.hosts, "errors": result.errors}
    finally:
        store.finish_run(run_id, ok, summary)
    if not check and ok and not tags:
        store.set_cluster_state(cluster.name, "bootstrapped")
    elif not check and not ok:
        store.set_failed_step(cluster.name, "bootstrap")
    for host, error in result.errors.items():
        console.say(f"  {host}: {error}")
    console.say(f"  artifacts: {result.artifact_dir}")
    return {"cluster": cluster.name, "ok": ok, "hosts": result.hosts}


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
    try:
        hosts = run_probes(
            files.inventory,
            files.ansible_cfg,
            [n.name for n in nodes],
            expect,
            run_dir,
            level=level,
            console=console.rich,
        )
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
