"""Health as a gate, without nodes: the level a flag asks for, the comparison of a node's rows
before and after a patch (a check failing both times does not stop the roll; a new failure
does, named with its check, what was found and the action), the roll's verdicts with the
probes, the play and the node readings replaced by what they would return, and `up`'s health
step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprov.core import health_gate, up
from gpuprov.core import patch as patching
from gpuprov.errors import BadInput
from gpuprov.results.shapes import Bootstrap, HealthCheck, HealthResult, UpResult, VerifySummary

XID_ACTION = "drain and reboot the node; RMA if it recurs"


def row(node: str, check: str, status: str, found: str = "", action: str = "") -> HealthCheck:
    return HealthCheck(node=node, check=check, status=status, found=found, expected="", action=action,
                       reason="container node" if status == "skip" else None)


def old_xid(node: str) -> HealthCheck:
    return row(node, "xid", "fail", "Xid 79 on GPU 0000:10:1c.0 (1x)", XID_ACTION)


# -- the level ------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["off", "quick", "standard"])
def test_built_levels_and_off_are_taken(value: str) -> None:
    assert health_gate.level(value) == value


@pytest.mark.parametrize(("value", "message"), [
    ("full", "--health full: one of off, quick, standard (full runs across the nodes for half an hour: "
             "`gpuprov health NAME --level full`)"),
    ("Quick", "--health Quick: one of off, quick, standard"),
    ("", "--health : one of off, quick, standard"),
])
def test_other_levels_are_bad_input(value: str, message: str) -> None:
    with pytest.raises(BadInput) as exc:
        health_gate.level(value)
    assert str(exc.value) == message


# -- the comparison ---------------------------------------------------------------------------------
def test_a_check_failing_before_and_after_is_no_new_failure() -> None:
    before = [row("n1", "gpu_count", "pass"), old_xid("n1")]
    after = [row("n1", "gpu_count", "pass"), old_xid("n1")]
    assert health_gate.new_failures(before, after) == []


def test_a_check_failing_only_after_is_a_new_failure() -> None:
    ecc = row("n1", "ecc", "fail", "GPU 0: 2 uncorrectable", "drain the node and reset the GPU")
    before = [row("n1", "ecc", "pass"), old_xid("n1")]
    after = [ecc, old_xid("n1")]
    assert health_gate.new_failures(before, after) == [ecc]
    assert health_gate.line(ecc) == "ecc: GPU 0: 2 uncorrectable -> drain the node and reset the GPU"


def test_a_skip_or_a_missing_row_before_does_not_excuse_a_failure_after() -> None:
    memlock = row("n1", "memlock", "fail", "user session: 8192 / 8192", "re-apply the rdma role")
    assert health_gate.new_failures([row("n1", "memlock", "skip")], [memlock]) == [memlock]
    assert health_gate.new_failures([], [memlock]) == [memlock]
    # A failure that went away is no failure.
    assert health_gate.new_failures([memlock], [row("n1", "memlock", "pass")]) == []


def test_rows_are_grouped_by_node_in_order() -> None:
    rows = [row("a", "ecc", "pass"), row("b", "ecc", "fail"), row("a", "xid", "pass")]
    assert {n: [r.check for r in rs] for n, rs in health_gate.by_node(rows).items()} == {
        "a": ["ecc", "xid"], "b": ["ecc"]}


# -- the roll, with its readers replaced -------------------------------------------------------------
class Console:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.rich = None

    def say(self, text: str) -> None:
        self.lines.append(text)


def a_roll(tmp_path: Path, nodes: list[str], health: str = "quick") -> patching.Roll:
    roll = patching.Roll("c", patching.request(kernel=True), {"hash": "old"}, {"hash": "new"}, {}, Console(),
                         health=health)
    roll.files = SimpleNamespace(inventory=tmp_path / "inventory.yml", ansible_cfg=tmp_path / "ansible.cfg")
    roll.run_dir = tmp_path
    roll.by_name = {n: SimpleNamespace(name=n) for n in nodes}
    roll.hosts = {n: {"status": "not-started", "changed": 0, "rebooted": False} for n in nodes}
    roll.batches = [[n] for n in nodes]
    return roll


def fake_readers(monkeypatch: pytest.MonkeyPatch, health: dict[str, list[list[HealthCheck]]]) -> list[str]:
    """The probes all pass, every play goes through with a change; each node's health readings
    are ``health[node]``'s next list (the baseline first). Returns the parts read, in order."""
    import gpuprov.health.run
    import gpuprov.probes.run

    parts: list[str] = []

    def probes(inventory: Any, cfg: Any, hosts: list[str], expect: Any, run_dir: Any, **_: Any):
        return {h: [{"probe": "driver", "status": "pass", "detail": ""}] for h in hosts}

    def play(roll: patching.Roll, number: int, ready: list[str]) -> list[str]:
        for host in ready:
            roll.hosts[host]["changed"] = 3
        return ready

    def check_nodes(nodes: list[Any], expected: dict[str, Any], files: Any, run_dir: Path, console: Any,
                    level: str):
        parts.append(run_dir.name)
        assert set(expected) == {n.name for n in nodes}
        return [r for n in nodes for r in health[n.name].pop(0)]

    monkeypatch.setattr(gpuprov.probes.run, "run_probes", probes)
    monkeypatch.setattr(gpuprov.health.run, "check_nodes", check_nodes)
    monkeypatch.setattr(patching, "play", play)
    return parts


def expect(nodes: list[str], lock: str) -> dict[str, Any]:
    return {n: {"instance_type": "docker-node", "gpus": 0, "stack": {"hash": lock}} for n in nodes}


def test_an_xid_from_before_the_patch_does_not_stop_the_roll(tmp_path: Path, monkeypatch) -> None:
    nodes = ["n1", "n2"]
    roll = a_roll(tmp_path, nodes)
    healthy = row("n2", "memlock", "pass")
    parts = fake_readers(monkeypatch, {"n1": [[old_xid("n1")], [old_xid("n1")]], "n2": [[healthy], [healthy]]})
    stopped = patching.roll_out(roll, nodes, expect(nodes, "old"), expect(nodes, "new"))
    assert stopped is False
    assert {h: s["status"] for h, s in roll.hosts.items()} == {"n1": "patched", "n2": "patched"}
    assert parts == ["health-before", "health-batch-1", "health-batch-2"]


def test_a_new_failure_fails_the_node_and_stops_the_roll(tmp_path: Path, monkeypatch) -> None:
    nodes = ["n1", "n2", "n3"]
    roll = a_roll(tmp_path, nodes)
    remap = row("n2", "row_remap", "fail", "GPU 0: remap pending", "drain the node and reset the GPU")
    fake_readers(monkeypatch, {"n1": [[old_xid("n1")], [old_xid("n1")]],
                               "n2": [[old_xid("n2"), row("n2", "row_remap", "pass")], [old_xid("n2"), remap]],
                               "n3": [[row("n3", "xid", "pass")]]})
    stopped = patching.roll_out(roll, nodes, expect(nodes, "old"), expect(nodes, "new"))
    assert stopped is True
    assert {h: s["status"] for h, s in roll.hosts.items()} == {
        "n1": "patched", "n2": "failed", "n3": "not-started"}
    assert roll.hosts["n2"]["error"] == ("health failed after the patch: row_remap: GPU 0: remap pending -> "
                                         "drain the node and reset the GPU")
    assert "  n2: FAILED: health failed after the patch: row_remap" in "\n".join(roll.console.lines)
    assert "c: roll stopped; not started: n3" in roll.console.lines


def test_the_health_gate_holds_each_reading_to_its_lock(tmp_path: Path, monkeypatch) -> None:
    """The baseline is held to the lock the nodes run before the patch, each batch to the new one
    (a driver check passes before the patch at the old release and after it at the new)."""
    import gpuprov.health.run

    roll = a_roll(tmp_path, ["n1"])
    fake_readers(monkeypatch, {})
    locks: list[str] = []

    def check_nodes(nodes: list[Any], expected: dict[str, Any], *_: Any) -> list[HealthCheck]:
        locks.append(expected["n1"].lock["hash"])
        return [row("n1", "driver", "pass")]

    monkeypatch.setattr(gpuprov.health.run, "check_nodes", check_nodes)
    assert patching.roll_out(roll, ["n1"], expect(["n1"], "old"), expect(["n1"], "new")) is False
    assert locks == ["old", "new"]


def test_health_off_reads_nothing(tmp_path: Path, monkeypatch) -> None:
    roll = a_roll(tmp_path, ["n1"], health="off")
    parts = fake_readers(monkeypatch, {})
    assert patching.roll_out(roll, ["n1"], expect(["n1"], "old"), expect(["n1"], "new")) is False
    assert parts == [] and roll.hosts["n1"]["status"] == "patched"


def test_checks_that_cannot_run_after_a_batch_fail_its_played_nodes(tmp_path: Path, monkeypatch) -> None:
    """CI of cc5032a: the probes after a batch of three (one node left out by a running job)
    could not be read, and the two nodes the play had moved were recorded not-started and left
    drained without a reason. A checking step that fails fails each played node with the
    reason, and the roll stops there."""
    import gpuprov.probes.run
    from gpuprov.errors import GpuprovError

    nodes = ["n1", "n2", "n3"]
    roll = a_roll(tmp_path, nodes)
    roll.batches = [nodes, ["n4"]]
    roll.by_name["n4"] = SimpleNamespace(name="n4")
    roll.hosts["n4"] = {"status": "not-started", "changed": 0, "rebooted": False}
    fake_readers(monkeypatch, {n: [[row(n, "xid", "pass")]] for n in nodes})
    monkeypatch.setattr(patching, "hook", lambda r, host, phase: host != "n3" or phase != "drain")

    def no_probes(*_: Any, **__: Any) -> None:
        raise GpuprovError("the probes did not run (pytest exit 3): boom")

    monkeypatch.setattr(gpuprov.probes.run, "run_probes", lambda inventory, cfg, hosts, *a, **k: (
        {h: [] for h in hosts} if "before" in str(a[1]) else no_probes()))
    assert patching.roll_out(roll, nodes, expect(nodes, "old"), expect(nodes, "new")) is True
    assert {h: s["status"] for h, s in roll.hosts.items()} == {
        "n1": "failed", "n2": "failed", "n3": "not-started", "n4": "not-started"}
    assert roll.hosts["n1"]["error"] == "not checked after the patch: the probes did not run (pytest exit 3): boom"
    assert "c: roll stopped; not started: n4" in roll.console.lines
    # An error of gpuprov's own still ends the command, each played node failed first.
    (tmp_path / "second").mkdir()
    roll = a_roll(tmp_path / "second", ["n1"])
    fake_readers(monkeypatch, {"n1": [[row("n1", "xid", "pass")]]})
    monkeypatch.setattr(patching, "check_health", lambda r, hosts, *a: (_ for _ in ()).throw(KeyError("x"))
                        if hosts and "after" in a[-1] else {})
    with pytest.raises(KeyError):
        patching.roll_out(roll, ["n1"], expect(["n1"], "old"), expect(["n1"], "new"))
    assert roll.hosts["n1"]["status"] == "failed" and roll.hosts["n1"]["error"].startswith(
        "not checked after the patch: KeyError")
    assert "  n1: FAILED: not checked after the patch: KeyError: 'x'" in roll.console.lines


def test_a_probe_regression_and_a_health_failure_are_both_named() -> None:
    state = {"status": "not-started", "changed": 1}
    temperature = row("n1", "temperature", "fail", "GPU 3 at 91 C", "drain and check cooling")
    patching.judge(state, ["driver: 535.288.01 loaded"], [temperature])
    assert state["status"] == "failed"
    assert state["error"] == ("probes failed after the patch: driver: 535.288.01 loaded; health failed after "
                              "the patch: temperature: GPU 3 at 91 C -> drain and check cooling")
    unchanged = {"status": "not-started", "changed": 0}
    patching.judge(unchanged, [], [])
    assert unchanged["status"] == "unchanged"


# -- up's health step ----------------------------------------------------------------------------------
def an_up_run(health: str) -> up.Run:
    return up.Run(spec=SimpleNamespace(name="c"), provider=None, store=None, console=Console(),
                         plan=None, lock={}, existing=None, recorded=None, health=health)


def up_result(ok: bool = True) -> UpResult:
    node = SimpleNamespace(name="c-node-1")
    return UpResult(cluster="c", provider="docker", nodes=[node], bootstrap=Bootstrap(ok=ok, hosts={}, errors={}))


def test_up_checks_health_after_a_bootstrap_that_went_through(monkeypatch) -> None:
    import gpuprov.health.run

    calls: list[str] = []
    memlock = row("c-node-1", "memlock", "fail", "user session: 8192 / 8192", "re-apply the rdma role")
    checked = HealthResult(cluster="c", level="quick", ok=False, started="t0", finished="t1",
                           checks=[row("c-node-1", "gpu_count", "pass"), memlock],
                           summary=VerifySummary(pass_=1, fail=1, skip=0))

    def cluster_health(name: str, *, console: Any, level: str, store: Any) -> HealthResult:
        calls.append(f"{name} {level}")
        return checked

    monkeypatch.setattr(gpuprov.health.run, "cluster_health", cluster_health)
    run = an_up_run("quick")
    result = up.check_health(run, up_result())
    assert result.health == checked and calls == ["c quick"]
    assert run.console.lines == ["c: not ready: c-node-1: health memlock: user session: 8192 / 8192 -> "
                                 "re-apply the rdma role"]
    # Off, or a bootstrap that failed (or did not run): no health run.
    assert up.check_health(an_up_run("off"), up_result()).health is None
    assert up.check_health(an_up_run("quick"), up_result(ok=False)).health is None
    no_bootstrap = UpResult(cluster="c", provider="docker", nodes=[], bootstrap=None)
    assert up.check_health(an_up_run("quick"), no_bootstrap) is no_bootstrap
    assert calls == ["c quick"]
