"""`up`'s end (gpuprov.core.up_verdict): the probes run once the nodes are bootstrapped and
healthy, and the verdict of its last line, for each way a run can end.

The probes themselves are replaced here by a result of the shape `verify` returns
(``probes``, a FIXTURE); the real path, `up` running them on real nodes, is proven by
tests/e2e/test_docker_cluster.py (the node from scratch) and test_baked_cluster.py (a cluster
grown from its image: the new node was never probed, so the verified cluster is probed again).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from gpuprov.core import up_verdict
from gpuprov.results.shapes import (
    Bootstrap,
    HealthCheck,
    HealthResult,
    HostStats,
    NodeRow,
    ProbeRow,
    PullReport,
    UpResult,
    VerifyResult,
    VerifySummary,
)

NODES = [NodeRow(name=f"c-node-{i}", id=f"id{i}", address="127.0.0.1", ssh_port=2200 + i, state="running",
                 zone="local", instance_type="docker-node") for i in (1, 2)]
OK = HostStats(ok=80, changed=3, failed=0, unreachable=0, tasks=83)


def _result(ok: bool = True, health_ok: bool | None = True, pull: PullReport | None = None) -> UpResult:
    hosts = {"c-node-1": OK, "c-node-2": OK if ok else dataclasses.replace(OK, failed=1)}
    health = None if health_ok is None else HealthResult(
        cluster="c", level="quick", ok=health_ok, started="t0", finished="t1",
        checks=[HealthCheck(node="c-node-2", check="gpu_count", status="pass" if health_ok else "fail",
                            found="0", expected="8", action="" if health_ok else "replace the node")],
        summary=VerifySummary(pass_=1 if health_ok else 0, fail=0 if health_ok else 1, skip=0))
    return UpResult(cluster="c", provider="docker", nodes=NODES, health=health,
                    bootstrap=Bootstrap(ok=ok, hosts=hosts, errors={}, pull=pull))


def _probes(fail: int = 0) -> VerifyResult:
    rows = {n.name: [ProbeRow(probe="driver_version", status="pass", detail="535.309.01")] for n in NODES}
    if fail:
        rows["c-node-2"] = [ProbeRow(probe="driver_version", status="fail", detail="found 535.288.01")]
    return VerifyResult(cluster="c", ok=not fail, hosts=rows, summary=VerifySummary(pass_=2 - fail, fail=fail, skip=0))


@pytest.fixture
def probes(monkeypatch):
    """The cluster's state as `load` reads it, and the verify calls made (FIXTURE in place of the
    probes over SSH)."""
    seen = SimpleNamespace(state="bootstrapped", calls=[], answer=_probes())

    def verify(name, *, console, store):
        seen.calls.append(name)
        return seen.answer

    monkeypatch.setattr(up_verdict, "verify", verify)
    monkeypatch.setattr(up_verdict, "load", lambda store, name: SimpleNamespace(state=seen.state))
    return seen


def _run(**kw) -> SimpleNamespace:
    return SimpleNamespace(name="c", tags=kw.get("tags", []), verify=kw.get("verify", True), store=None, console=None)


def test_probes_pass_the_cluster_is_ready_and_ssh_is_next(probes) -> None:
    done = up_verdict.finish(_run(), _result())
    assert probes.calls == ["c"] and done.verify == probes.answer
    assert done.verdict.ready is True and done.verdict.next == "gpuprov ssh c"
    assert done.verdict.why == "2 node(s) verified (2 probes passed)"


def test_a_probe_that_fails_is_not_ready_and_names_its_node(probes) -> None:
    probes.answer = _probes(fail=1)
    done = up_verdict.finish(_run(), _result())
    assert done.verdict.ready is False and done.verdict.next == "gpuprov verify c"
    assert done.verdict.why == "1 probe(s) failed (c-node-2)"


@pytest.mark.parametrize(("result", "why", "then"), [
    (_result(ok=False), "the bootstrap failed (c-node-2)", "gpuprov provision c"),
    (_result(health_ok=False), "a health check failed (c-node-2)", "gpuprov health c"),
    (_result(pull=PullReport(bundle_sha256="ab", bundle_bytes=1, verify=VerifySummary(pass_=3, fail=2, skip=0))),
     "2 probe(s) failed on the nodes (run by each node on itself)", "gpuprov verify c"),
])
def test_a_step_that_failed_is_not_ready_and_no_probe_runs(probes, result, why, then) -> None:
    done = up_verdict.finish(_run(), result)
    assert probes.calls == [] and done.verify is None
    assert (done.verdict.ready, done.verdict.why, done.verdict.next) == (False, why, then)


def test_no_verify_and_tags_end_bootstrapped_not_failed(probes) -> None:
    skipped = up_verdict.finish(_run(verify=False), _result())
    assert (skipped.verdict.ready, skipped.verdict.next) == (None, "gpuprov verify c")
    assert "--no-verify" in skipped.verdict.why
    tagged = up_verdict.finish(_run(tags=["preflight", "driver"]), _result())
    assert (tagged.verdict.ready, tagged.verdict.next) == (None, "gpuprov provision c")
    assert tagged.verdict.why == "bootstrapped with --tags preflight,driver only"
    assert probes.calls == []


def test_a_cluster_already_verified_is_not_probed_again(probes) -> None:
    """An `up` again on a verified cluster (nothing to resume), or pull nodes that probed themselves."""
    probes.state = "verified"
    again = up_verdict.finish(_run(), _result())
    assert probes.calls == [] and again.verdict.ready is True and again.verdict.why == "2 node(s) verified already"
    pulled = up_verdict.finish(_run(), _result(pull=PullReport(
        bundle_sha256="ab", bundle_bytes=1, verify=VerifySummary(pass_=3, fail=0, skip=1))))
    assert pulled.verdict.why == "2 node(s) verified by the nodes themselves"


def test_no_bootstrap_has_no_verdict(probes) -> None:
    done = up_verdict.finish(_run(), dataclasses.replace(_result(), bootstrap=None, health=None))
    assert done.verdict is None and probes.calls == []
