"""`verify`: the testinfra probes on a cluster's nodes, each node's rows and the summary."""

from __future__ import annotations

from gpuprov.ansible.inventory import render
from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import (
    check_reachable,
    expectations,
    load,
    phase_at_least,
    reachable_nodes,
    refresh,
    unreachable_row,
    version_lock,
)
from gpuprov.console import Console
from gpuprov.core.monitoring import monitoring_host
from gpuprov.probes import run as probes_run
from gpuprov.results.shapes import ProbeRow, VerifyResult, VerifySummary
from gpuprov.slurm import scheduler
from gpuprov.state import Store


def verify(
    name: str, *, console: Console, store: Store | None = None, level: str = "quick", only: str | None = None
) -> VerifyResult:
    """The probes on the cluster's nodes (``only``: a marker expression choosing the groups)."""
    if only:
        probes_run.check_groups(only)  # a wrong group is refused before any node is asked
    store = store or Store()
    cluster = load(store, name)
    provider, files, nodes = refresh(store, cluster)
    nodes = reachable_nodes(cluster, nodes)
    # A Slurm cluster's probes know it runs Slurm (a node that lost its configuration fails);
    # elsewhere they skip where the node has no Slurm, saying so (as a pull node's own do).
    expect = expectations(provider, nodes, version_lock(store, cluster))
    if scheduler.of(cluster).kind == "slurm":
        expect = {n: {**e, "scheduler": "slurm"} for n, e in expect.items()}
    render(cluster.name, cluster.provider, nodes, expect, files, monitoring_host(cluster.spec))
    run_dir = new_run_dir(files, f"verify-{level}")
    run_id = store.start_run(cluster.name, f"verify-{level}", str(run_dir))
    ok = False
    counts = {"pass": 0, "fail": 0, "skip": 0}
    hosts: dict[str, list[ProbeRow]] = {}
    try:
        # Each node is checked once: an unreachable one is one failed row with the SSH
        # error, not a failure per probe; the probes run on the nodes that answer.
        reachable, down = check_reachable(files, nodes, console)
        probed = {}
        if reachable:
            probed = probes_run.run_probes(
                files.inventory,
                files.ansible_cfg,
                [n.name for n in reachable],
                expect,
                run_dir,
                level=level,
                console=console.rich,
                only=only,
            )
        rows = {h: [ProbeRow.of(r) for r in found] for h, found in probed.items()}
        hosts = {n.name: [unreachable_row(down[n.name])] if n.name in down else rows.get(n.name, [])
                 for n in nodes}
        hosts |= {h: found for h, found in rows.items() if h not in hosts}
        for results in hosts.values():
            for r in results:
                counts[r.status] += 1
        ok = counts["fail"] == 0 and all(hosts.get(n.name) for n in nodes)
    finally:
        store.finish_run(run_id, ok, counts)
    if ok and phase_at_least(cluster, "bootstrapped"):
        store.set_cluster_state(name, "verified")
    elif not ok:
        store.set_failed_step(name, "verify")
    summary = VerifySummary(pass_=counts["pass"], fail=counts["fail"], skip=counts["skip"])
    return VerifyResult(cluster=name, ok=ok, hosts=hosts, summary=summary)
