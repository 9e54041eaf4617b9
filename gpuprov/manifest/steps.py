"""The manifest's steps in a converge (gpuprov.core.provision.run_site): each node's inputs, the
check of the nodes that have a manifest, which nodes the play runs on, the records forgotten
before a run and written after one that succeeded, and the result with the nodes that held."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuprov.ansible.inventory import to_json
from gpuprov.manifest import collect, record, remote
from gpuprov.providers import ClusterFiles
from gpuprov.results.manifest import ManifestCheck
from gpuprov.results.shapes import HostStats, ProvisionResult
from gpuprov.state import ClusterRecord, NodeRecord, Store

NOTHING_RAN = HostStats(ok=0, changed=0, failed=0, unreachable=0, tasks=0)


def inputs_of(context: Mapping[str, Any], extravars: Mapping[str, Any],
              tags: Sequence[str] | None) -> tuple[str, dict[str, str]]:
    """The run's scope and each node's inputs digest (from the inventory just rendered)."""
    scope = record.scope_of(tags)
    me = remote.identity()
    hostvars = to_json(context)["_meta"]["hostvars"]
    return scope, {name: record.inputs_digest(extravars, hv, scope, me) for name, hv in hostvars.items()}


def verdicts(cluster: ClusterRecord, files: ClusterFiles, nodes: Sequence[NodeRecord],
             inputs: Mapping[str, str], scope: str) -> dict[str, record.Verdict]:
    """Each node's verdict. Only a node with a record of this scope is asked (one SSH round
    trip each, all at once); the others need no question to be run."""
    found = record.records(cluster)
    asked = [n for n in nodes if (found.get(n.name) or {}).get("scope") == scope
             and (found.get(n.name) or {}).get("id") == n.id]
    answers = remote.check(asked, files.login_key, files.known_hosts)
    out = {}
    for n in nodes:
        answer = answers.get(n.name)
        out[n.name] = record.verdict(n, found.get(n.name), answer.data if answer else None,
                                     answer.error if answer else None, inputs[n.name], scope)
    return out


def to_run(nodes: Sequence[NodeRecord], found: Mapping[str, record.Verdict], *, slurm: bool,
           say: Callable[[str], None]) -> list[NodeRecord]:
    """The nodes the play runs on (every node when no verdict was asked for), each verdict said
    once. On a Slurm cluster the play runs on every node or none: slurm.conf lists the play's
    hosts, and a run on some of them would leave the others out of it."""
    if not found:
        return list(nodes)
    for n in nodes:
        say(f"  {n.name}: {found[n.name].line}")
    chosen = [n for n in nodes if found[n.name].run]
    if slurm and chosen and len(chosen) < len(nodes):
        say("  slurm: the cluster's nodes converge together (slurm.conf lists them all): every node runs")
        return list(nodes)
    return chosen


def forget(store: Store, name: str, nodes: Sequence[NodeRecord]) -> None:
    """The records of the nodes about to be converged: until the run succeeds they hold none."""
    record.write(store, name, {n.name: None for n in nodes})


def record_run(store: Store, name: str, files: ClusterFiles, nodes: Sequence[NodeRecord], result: Any,
               inputs: Mapping[str, str], scope: str, *, say: Callable[[str], None]) -> None:
    """After a run that succeeded: each node's manifest written from what its tasks managed, and
    recorded. A node whose snapshot fails keeps no record (its next `provision` runs it)."""
    if result is None:
        return
    items = {n.name: collect.collect(result.results.get(n.name, [])) for n in nodes}
    answers = remote.snapshot(nodes, files.login_key, files.known_hosts, items, scope)
    me = remote.identity()
    changes: dict[str, dict[str, Any] | None] = {}
    for n in nodes:
        answer = answers[n.name]
        if answer.data is None or not isinstance(answer.data.get("digest"), str):
            say(f"  {n.name}: manifest not written ({answer.error or 'no digest'}); its next provision runs it")
            changes[n.name] = None
            continue
        changes[n.name] = record.new_record(n, answer.data, inputs[n.name], scope, me)
    record.write(store, name, changes)


def merged(outcome: ProvisionResult, nodes: Sequence[NodeRecord],
           found: Mapping[str, record.Verdict]) -> ProvisionResult:
    """The run's result with the nodes whose manifest held (nothing ran there: every count 0)
    and, where verdicts were asked for, each node's."""
    if not found:
        return outcome
    hosts = {n.name: outcome.hosts.get(n.name, NOTHING_RAN) for n in nodes}
    checks = {n: ManifestCheck(state=v.state, action="full run" if n in outcome.hosts else "unchanged",
                               items=v.items, drift=list(v.drift)) for n, v in found.items()}
    return replace(outcome, hosts=hosts, manifest=checks)
