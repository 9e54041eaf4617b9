"""`up --min-count K`: nodes that fail their bootstrap or the health gate are set aside and
replaced, round by round, while the retry budget (``--retries``) lasts.

1. The bootstrap and the health gate run as without --min-count, but nothing is rolled back
   yet. Each node this run launched that failed is named, one line each (``NODE: bootstrap
   failed: ERROR``, ``NODE: health failed: CHECK: FOUND -> ACTION``), and set aside:
   terminated (the provider's ``terminate_nodes``) or, with ``--keep-failed``, left running
   outside the node list. A kept node is recorded in the cluster's ``spec.kept`` (which node,
   why, when); it keeps the cluster's label at the provider, so `gpuprov down NAME` removes
   it with the cluster, and every command that lists the nodes leaves it out.
2. While nodes are missing and rounds are left, a round launches replacements (the
   provider's launch at the cluster's count: it launches the missing ones, as `up` run again
   does), reaches them, bootstraps and gates only them; what fails is set aside again.
3. Each node set aside is recorded in ``spec.replaced`` (old, new, why, when, kept), beside
   `patch --onto-image`'s replacements; ``new`` is null when nothing took its place.
4. With at least K converged (and healthy) nodes `up` succeeds and says the cluster has M of
   its N; `up` again adds the rest. Below K the run's rollback rule applies as without
   --min-count (a new aws cluster: all it launched is removed), unless --keep-failed, which
   keeps everything to look at. A node that was in the cluster before this run is never set
   aside: it is named, stays, and `up` fails.

Without --min-count nothing here acts: `up` is all or nothing as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpuprov.cluster import kept_alive, load
from gpuprov.core import counts, health_gate
from gpuprov.core.up_steps import (
    Run,
    bootstrap_nodes,
    check_health,
    launch,
    reach,
    rollback,
    up_result,
    wait_ready,
)
from gpuprov.errors import GpuprovError
from gpuprov.health import run as health_run
from gpuprov.results.shapes import Bootstrap, HealthCheck, HealthResult, HostStats, Replacement, UpResult
from gpuprov.state import NodeRecord, now

# One round by default: a node that fails its bootstrap is most often a bad host or a passing
# fault, which one fresh node clears; a replacement that fails again points at the image or the
# plays, where more launches only cost more (each one a billed GPU instance).
DEFAULT_RETRIES = 1


def bootstrap(run: Run, nodes: list[NodeRecord]) -> UpResult:
    """`up`'s bootstrap and health gate; with --min-count, the rounds of the module docstring."""
    spec = run.spec
    if not spec.min_count:
        return check_health(run, bootstrap_nodes(run, nodes))
    return Rounds(run, spec.min_count, DEFAULT_RETRIES if spec.retries is None else spec.retries,
                  spec.keep_failed).go(nodes)


@dataclass
class Rounds:
    """One `up --min-count K`'s bootstrap, health gate and replacement rounds, and what they found."""

    run: Run
    least: int
    budget: int
    keep: bool
    rollback: bool = False  # the run's rollback rule: applied at the end, below K
    mine: set[str] = field(default_factory=set)  # ids of the nodes this run launched
    stuck: dict[str, str] = field(default_factory=dict)  # failed nodes that stay: name -> why
    hosts: dict[str, HostStats] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rows: dict[str, list[HealthCheck]] = field(default_factory=dict)
    health: list[HealthResult] = field(default_factory=list)
    replaced: list[Replacement] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)  # ids of the nodes set aside and left running
    first: Bootstrap | None = None

    def say(self, text: str) -> None:
        self.run.console.say(text)

    def go(self, nodes: list[NodeRecord]) -> UpResult:
        run = self.run
        self.rollback, run.rollback = run.rollback, False  # judged at the end, not per round
        try:
            result = bootstrap_nodes(run, nodes)
            self.first = result.bootstrap
            if self.first is not None and not self.first.resumed_from:
                self.mine = {n.id for n in run.added}
                failed = self.judge(nodes, self.first)
                blamed = self.first.ok or bool(failed)  # else no node to blame: all or nothing
                nodes = self.settle(nodes, failed) if blamed else nodes
        except BaseException:
            cluster = run.store.get_cluster(run.name)
            if self.rollback and cluster is not None:
                rollback(run, list(cluster.nodes), whole=run.created_record)
            raise
        finally:
            run.rollback = self.rollback
        if self.first is None or self.first.resumed_from:  # nothing ran: as without --min-count
            return check_health(run, result)
        return self.finish(nodes, blamed)

    def judge(self, nodes: list[NodeRecord], boot: Bootstrap) -> dict[str, str]:
        """{node: why} for each of ``nodes`` that failed its bootstrap, then the health gate on
        the others."""
        # Per node name, its last bootstrap (a replacement may take the name of a node set aside).
        self.hosts.update(boot.hosts)
        self.errors = {**{k: v for k, v in self.errors.items() if k not in boot.hosts}, **boot.errors}
        failed = {}
        for n in nodes:
            stats = boot.hosts.get(n.name)
            if n.name in boot.errors or (stats is not None and (stats.failed or stats.unreachable)):
                failed[n.name] = "bootstrap failed: " + (boot.errors.get(n.name) or (
                    f"{stats.failed if stats else 0} failed task(s), {stats.unreachable if stats else 0} unreachable"))
        passed = [n.name for n in nodes if n.name not in failed]
        if passed and self.run.health != health_gate.OFF:
            run = self.run
            checked = health_run.cluster_health(run.name, console=run.console, level=run.health, store=run.store,
                                                only=passed)
            self.health.append(checked)
            self.rows.update(health_gate.by_node(checked.checks))
            for node, rows in health_gate.by_node(health_gate.failures(checked.checks)).items():
                failed[node] = "health failed: " + "; ".join(health_gate.line(r) for r in rows)
        return failed

    def settle(self, nodes: list[NodeRecord], failed: dict[str, str]) -> list[NodeRecord]:
        """Set failures aside and launch replacements while rounds are left; the nodes then."""
        pending: list[tuple[NodeRecord, str]] = []  # set aside, nothing in their place yet
        spent = 0
        while True:
            for node, why in sorted(failed.items()):
                self.say(f"{node}: {why}")
            out = [n for n in nodes if n.name in failed and n.id in self.mine]
            for n in nodes:
                if n.name in failed and n.id not in self.mine:
                    self.stuck[n.name] = failed[n.name]
                    self.say(f"  {n.name}: in the cluster before this run: left as it is (`gpuprov provision "
                             f"{self.run.name}` converges it again)")
            nodes = self.set_aside(nodes, out, failed)
            pending += [(n, failed[n.name]) for n in out if n.name not in self.stuck]
            if not pending or spent == self.budget:
                break
            spent += 1
            try:
                nodes, added, failed = self.replace(spent, nodes, [old for old, _ in pending])
            except GpuprovError as exc:
                self.say(f"{self.run.name}: replacement round {spent} failed: {exc}")
                failed = {}
                continue
            self.record(pending[:len(added)], added)
            pending = pending[len(added):]
        if pending:
            self.say(f"{self.run.name}: no rounds left (--retries {self.budget}): "
                     f"{', '.join(n.name for n, _ in pending)} not replaced")
        self.record(pending, [])
        return nodes

    def set_aside(self, nodes: list[NodeRecord], out: list[NodeRecord], failed: dict[str, str]) -> list[NodeRecord]:
        """Terminate ``out`` (or keep it running, recorded in spec.kept); the nodes left."""
        run = self.run
        if not out:
            return nodes
        keep = self.keep or not run.provider.supports("terminate_nodes")
        if keep:
            cluster = load(run.store, run.name)
            kept = [*(cluster.spec.get("kept") or []), *(
                {**dataclasses.asdict(n), "why": failed[n.name], "when": now()} for n in out)]
            run.store.set_spec(run.name, {**cluster.spec, "kept": kept})
            for n in out:
                self.say(f"  {n.name}: kept running for inspection ({n.id}, {n.address}), out of the node list; "
                         f"`gpuprov down {run.name}` removes it with the cluster")
            gone = {n.id for n in out}
            self.kept |= gone
        else:
            run.report(f"terminating the failed node(s): {', '.join(n.name for n in out)}")
            stay = set(run.provider.terminate_nodes(out, run.made_files, run.report))
            for n in out:
                if n.id in stay:
                    self.stuck[n.name] = failed[n.name]
                    self.say(f"  {n.name}: could not be terminated ({n.id}); it stays in the cluster")
            gone = {n.id for n in out} - stay
        nodes = [n for n in nodes if n.id not in gone]
        run.store.replace_nodes(run.name, nodes)
        run.added = [n for n in run.added if n.id not in gone]
        return nodes

    def replace(self, number: int, nodes: list[NodeRecord],
                missing: list[NodeRecord]) -> tuple[list[NodeRecord], list[NodeRecord], dict[str, str]]:
        """One round: the missing nodes launched, reached, bootstrapped and gated, alone."""
        run = self.run
        cluster = load(run.store, run.name)
        new = counts.counted(run.provider.plan(run.spec, run.made_files), run.provider,
                             len(kept_alive(run.provider, cluster)))
        plan = dataclasses.replace(run.plan, spec=new.spec, to_create=new.to_create, min_create=new.min_create,
                                   existing=new.existing, notes=new.notes, details=new.details)
        self.say(f"{run.name}: replacement round {number} of {self.budget}: in place of "
                 f"{', '.join(n.name for n in missing)}, launching the {new.to_create} missing node(s)")
        step = dataclasses.replace(run, plan=plan, existing=cluster, created_record=False, added=[], rollback=True)
        nodes = wait_ready(step, launch(step))  # either undoes what it made, and raises
        step.rollback = False
        if not step.added:
            raise GpuprovError("the provider launched no node")
        for old, n in zip(missing, step.added, strict=False):
            self.say(f"  {n.name}: replaces {old.name}")
        self.mine |= {n.id for n in step.added}
        run.added = [*run.added, *step.added]
        result = bootstrap_nodes(step, step.added)
        assert result.bootstrap is not None
        return nodes, step.added, self.judge(step.added, result.bootstrap)

    def record(self, gone: list[tuple[NodeRecord, str]], added: list[NodeRecord]) -> None:
        """spec.replaced: each node set aside, and what took its place (None: nothing)."""
        if not gone:
            return
        rows = [Replacement(old=old.name, new=new.name if new else None, why=why, when=now(), kept=old.id in self.kept,
                            old_id=old.id, new_id=new.id if new else None)
                for (old, why), new in zip(gone, [*added, *[None] * len(gone)], strict=False)]
        self.replaced += rows
        cluster = load(self.run.store, self.run.name)
        done = [*(cluster.spec.get("replaced") or []), *(_record(r) for r in rows)]
        self.run.store.set_spec(self.run.name, {**cluster.spec, "replaced": done})

    def finish(self, nodes: list[NodeRecord], blamed: bool = True) -> UpResult:
        """The judgement: at least K nodes converged (and healthy), none failed that stays."""
        run, wanted = self.run, self.run.spec.launch_count
        ok = blamed and not self.stuck and len(nodes) >= self.least
        if ok:
            reach(run.store, run.name, "reachable" if run.tags else "bootstrapped")
            self.say(f"{run.name}: the cluster has {len(nodes)} of its {wanted} node(s) (--min-count {self.least})"
                     + (f"; `gpuprov up {run.name}` again adds the rest" if len(nodes) < wanted else ""))
        else:
            run.store.set_failed_step(run.name, "bootstrap")
            good = len(nodes) - len(self.stuck)
            self.say(f"{run.name}: the bootstrap failed on no node in particular (above): all or nothing" if not blamed
                     else f"{run.name}: {good} of {wanted} node(s) converged" + (" and healthy" if self.health else "")
                     + (f", fewer than --min-count {self.least}" if good < self.least else "")
                     + (f"; failed and left in the cluster: {', '.join(sorted(self.stuck))}" if self.stuck else ""))
            if self.rollback and not self.keep:
                run.report("--rollback is on: removing what this run launched")
                nodes = rollback(run, nodes, whole=run.created_record)
        assert self.first is not None
        boot = dataclasses.replace(self.first, ok=ok, hosts=self.hosts, errors=self.errors)
        return dataclasses.replace(up_result(run, nodes, boot), health=self.merged_health(nodes),
                                   replaced=self.replaced or None)

    def merged_health(self, nodes: list[NodeRecord]) -> HealthResult | None:
        """The health rows of the nodes the cluster ends with, from the round that gated each."""
        if not self.health:
            return None
        checks = [r for n in nodes for r in self.rows.get(n.name, [])]
        summary = health_run.summarise(checks)
        return dataclasses.replace(self.health[0], ok=bool(checks) and summary.fail == 0,
                                   finished=self.health[-1].finished, checks=checks, summary=summary)


def _record(row: Replacement) -> dict[str, Any]:
    """A row as spec.replaced keeps it (``new`` null when nothing took the node's place)."""
    return {k: v for k, v in dataclasses.asdict(row).items() if v is not None or k == "new"}
