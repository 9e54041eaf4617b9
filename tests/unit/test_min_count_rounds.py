"""`up --min-count K`'s rounds (gpuprov.core.min_count) through the whole `up`, with a provider,
a bootstrap and a health gate of the test's own: the branches the EC2 tests
(tests/aws/test_replace_failed.py, real nodes) do not run: the health gate failing a node, the
budget spent with K still met, no rounds at all, a node from before the run failing, and `up`
without --min-count left all or nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuprov.console import Console
from gpuprov.core import up, up_steps
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider, Reporter, spec
from gpuprov.results.shapes import HealthCheck, HealthResult, HostStats, ProvisionResult, VerifySummary
from gpuprov.state import NodeRecord, Store


class Fleet(Provider):
    """Nodes fc-node-1, fc-node-2, ... (ids id-1, ...), numbered in launch order, never reused."""

    name = "fleet"
    billable = True

    def __init__(self) -> None:
        self.members: list[NodeRecord] = []
        self.launched = 0
        self.terminated: list[str] = []
        self.bad_bootstrap: set[str] = set()  # node ids whose bootstrap fails
        self.bad_health: set[str] = set()  # node ids that fail the health gate

    partial_launch = True  # it takes --min-count

    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        return Plan(spec=spec, existing=len(self.members), billable=True)

    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        for _ in range(plan.to_create):  # as core counted them
            self.launched += 1
            self.members.append(NodeRecord(name=f"fc-node-{self.launched}", id=f"id-{self.launched}",
                                           address=f"10.0.0.{self.launched}", ssh_port=22, user="u", state="running"))
        return list(self.members)

    def wait_ready(self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles,
                   report: Reporter) -> list[NodeRecord]:
        return nodes

    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        return list(self.members)

    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        gone, self.members = len(self.members), []
        return gone

    def terminate_nodes(self, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
        self.terminated += [n.id for n in nodes]
        self.members = [m for m in self.members if m.id not in {n.id for n in nodes}]
        return []


@pytest.fixture
def fleet(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    """The provider, with a bootstrap and a health gate that fail the nodes it says."""
    provider = Fleet()
    monkeypatch.setattr(up, "get_provider", lambda name: provider)
    # In the registry, as every provider is (its facts: priced, as EC2 is)
    monkeypatch.setitem(spec.PROVIDERS, "fleet", spec.ProviderFacts("fleet_for_tests", priced=True))

    def provision(store, cluster, prov, files, nodes, *, console, check=False, tags=None, use_manifest=False,
                  say_next=True):
        bad = {n.name for n in nodes if n.id in provider.bad_bootstrap}
        hosts = {n.name: HostStats(ok=3, changed=1, failed=int(n.name in bad), unreachable=0, tasks=4) for n in nodes}
        ok = not bad
        store.set_cluster_state(cluster.name, "bootstrapped") if ok else store.set_failed_step(cluster.name, "bootstrap")
        return ProvisionResult(cluster=cluster.name, ok=ok, hosts=hosts, errors={h: "disk full" for h in bad})

    def health(name, *, console, level, store, only=()):
        ids = {n.name: n.id for n in provider.members}
        rows = [HealthCheck(node=h, check="gpu_count", status="fail" if ids[h] in provider.bad_health else "pass",
                            found="0", expected="8", action="replace the node") for h in only]
        fail = sum(r.status == "fail" for r in rows)
        return HealthResult(cluster=name, level=level, ok=not fail, started="t0", finished="t1", checks=rows,
                            summary=VerifySummary(pass_=len(rows) - fail, fail=fail, skip=0))

    monkeypatch.setattr(up_steps, "run_site", provision)
    monkeypatch.setattr("gpuprov.health.run.cluster_health", health)
    return provider


def _up(capsys: pytest.CaptureFixture[str], count: int, *, health: str = "off", **options: Any):
    """`up` of cluster fc: its result, and the lines it said (stderr)."""
    spec = ClusterSpec(name="fc", provider="fleet", instance_type=None, count=count, **options)
    # (no probes: the rounds end with the health gate; `up`'s probes after it: test_up_verdict.py)
    result = up.up(up.UpRequest(spec, health=health, verify=False), console=Console())
    return result, capsys.readouterr().err.splitlines()


def test_a_node_failing_the_health_gate_is_named_terminated_and_replaced(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.bad_health = {"id-2"}
    result, lines = _up(capsys, 2, health="quick", min_count=1)
    assert "fc-node-2: health failed: gpu_count: 0 -> replace the node" in lines
    assert fleet.terminated == ["id-2"] and "  fc-node-3: replaces fc-node-2" in lines
    assert result.bootstrap.ok and result.health.ok and [n.name for n in result.nodes] == ["fc-node-1", "fc-node-3"]
    assert [r.node for r in result.health.checks] == ["fc-node-1", "fc-node-3"]  # the nodes it ends with
    (row,) = result.replaced
    assert (row.old, row.new, row.old_id, row.new_id, row.kept) == ("fc-node-2", "fc-node-3", "id-2", "id-3", False)
    assert "fc: the cluster has 2 of its 2 node(s) (--min-count 1)" in lines


def test_a_spent_budget_with_k_nodes_left_succeeds_with_m_of_n(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.bad_bootstrap = {"id-2", "id-4"}
    result, lines = _up(capsys, 3, min_count=2, retries=1)
    assert result.bootstrap.ok and [n.name for n in result.nodes] == ["fc-node-1", "fc-node-3"]
    assert [(r.old, r.new) for r in result.replaced] == [("fc-node-2", "fc-node-4"), ("fc-node-4", None)]
    assert "fc: no rounds left (--retries 1): fc-node-4 not replaced" in lines
    assert "fc: the cluster has 2 of its 3 node(s) (--min-count 2); `gpuprov up fc` again adds the rest" in lines
    cluster = Store().get_cluster("fc")
    assert cluster.state == "bootstrapped" and cluster.failed_step is None
    assert [r["old"] for r in cluster.spec["replaced"]] == ["fc-node-2", "fc-node-4"]


def test_no_rounds_sets_the_failure_aside_and_judges_what_is_left(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.bad_bootstrap = {"id-2"}
    result, lines = _up(capsys, 2, min_count=2, retries=0)
    assert not result.bootstrap.ok and result.nodes == [] and fleet.members == []  # below K: rolled back
    assert fleet.launched == 2 and "fc: 1 of 2 node(s) converged, fewer than --min-count 2" in lines
    assert Store().get_cluster("fc") is None


def test_a_node_from_before_the_run_is_named_and_never_set_aside(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    assert _up(capsys, 1)[0].bootstrap.ok
    fleet.bad_bootstrap = {"id-1"}
    result, lines = _up(capsys, 2, min_count=1)
    assert "fc-node-1: bootstrap failed: disk full" in lines
    assert any(line.startswith("  fc-node-1: in the cluster before this run: left as it is") for line in lines)
    assert not result.bootstrap.ok and fleet.terminated == [] and result.replaced is None
    assert [n.name for n in result.nodes] == ["fc-node-1", "fc-node-2"]  # an existing cluster: no rollback


def test_without_min_count_up_stays_all_or_nothing(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    fleet.bad_bootstrap = {"id-2"}
    result, lines = _up(capsys, 2)
    assert not result.bootstrap.ok and result.nodes == [] and result.replaced is None
    assert fleet.members == [] and fleet.terminated == [] and fleet.launched == 2
    assert not any("bootstrap failed:" in line for line in lines)
    assert Store().get_cluster("fc") is None
