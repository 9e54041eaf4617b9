"""Review 4, item 8: numbers a node prints are data, and a bad one means "not checked" for that
node, never an exception for the cluster. nccl-tests' ``# Avg bus bandwidth : 1.2.3`` is no
figure; a manifest answer whose ``items`` is text, a float or 1e999, or whose ``drift`` is no
list of words, is a full run with the reason. Then the same promise held over mutated real
recordings (tests/fixtures/recordings): a seeded random mutator (the standard library's; the
project does not depend on hypothesis) changes, drops, doubles and swaps lines, numbers and
bytes of the recorded nccl-tests output and of a manifest check's answer, and no exception
escapes the parser or the verdict; with the pull reports' checker (review item 2), only
BadReport does."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpuprov.health import nccl
from gpuprov.manifest import record
from gpuprov.pull.reports import BadReport, check_report
from gpuprov.state import NodeRecord
from tests.fixtures.mutate import mutate_text as _mutate_text
from tests.fixtures.mutate import mutate_value as _mutate_value

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
NCCL = (REC / "h100-sxm5-580" / "nccl-tests.txt").read_text()
NODE = NodeRecord(name="n1", id="i-1", address="10.0.0.1", ssh_port=22, user="u", state="running", zone="static")
RECORD = {"id": "i-1", "digest": "d" * 64, "inputs": "in", "scope": "all"}
HELD = {"state": "held", "digest": "d" * 64, "items": 412, "drift": []}
EXAMPLES = 1500  # each property: a second or two on one core


def test_an_average_bandwidth_that_is_no_number_is_no_figure() -> None:
    text = NCCL.replace("# Avg bus bandwidth    : 0 ", "# Avg bus bandwidth    : 1.2.3")
    assert "1.2.3" in text
    runs = nccl.parse_tests(text)
    assert runs and all(r.avg_busbw is None for r in runs)
    for bad in ("1e999", "--", "+", "."):
        assert all(r.avg_busbw is None for r in nccl.parse_tests(NCCL.replace(" : 0 ", f" : {bad}")))
    check = nccl.bandwidth_check("n1", text, instance_type="p5.48xlarge", nodes=1)
    assert check.status in ("pass", "fail")


@pytest.mark.parametrize("answer", [
    {**HELD, "items": "many"}, {**HELD, "items": 1e999}, {**HELD, "items": 2.5}, {**HELD, "items": True},
    {**HELD, "items": -1}, {**HELD, "drift": 5}, {**HELD, "drift": "x"}, {**HELD, "drift": [1, 2]},
    {**HELD, "drift": {"a": 1}}, {**HELD, "state": "drifted", "items": "many"},
])
def test_a_manifest_answer_with_bad_fields_is_not_checked_a_full_run(answer: dict) -> None:
    found = record.verdict(NODE, RECORD, answer, None, "in", "all")
    assert found.run and found.state == "manifest not checked" and found.items == 0
    assert "items, drift" in found.line


def test_a_manifest_answer_that_is_good_still_holds() -> None:
    assert not record.verdict(NODE, RECORD, HELD, None, "in", "all").run
    drifted = record.verdict(NODE, RECORD, {**HELD, "state": "drifted", "drift": ["/etc/x changed"]}, None, "in", "all")
    assert drifted.run and drifted.drift == ("/etc/x changed",)


@pytest.mark.parametrize("items", ["many", 1e999, None, [1]])
def test_a_manifest_record_with_a_bad_item_count_records_none(items: object) -> None:
    made = record.new_record(NODE, {"digest": "d" * 64, "items": items}, "in", "all", {})
    assert made["items"] == 0


# -- properties over mutated recordings --------------------------------------------------------
def test_no_exception_escapes_the_nccl_parser_on_mutated_recordings() -> None:
    rng = random.Random(54)
    for _ in range(EXAMPLES):
        text = _mutate_text(rng, NCCL)
        nccl.parse_tests(text)
        check = nccl.bandwidth_check("n1", text, instance_type=rng.choice(["p5.48xlarge", None]), nodes=1)
        assert check.status in ("pass", "fail")


def test_no_exception_escapes_the_manifest_verdict_on_mutated_answers() -> None:
    rng = random.Random(54)
    drifted = {**HELD, "state": "drifted", "drift": ["/etc/apt/sources.list.d/x changed", "nvidia-driver 580"]}
    for _ in range(EXAMPLES):
        answer = _mutate_value(rng, rng.choice([HELD, drifted]))
        found = record.verdict(NODE, RECORD, answer, None, "in", "all")
        assert isinstance(found.line, str) and isinstance(found.items, int)
        if isinstance(answer, dict):  # new_record gets an object with a digest (its callers check)
            assert isinstance(record.new_record(NODE, {**answer, "digest": "d" * 64}, "in", "all", {})["items"], int)


def _recorded_report() -> bytes:
    events = [{"event": "agent", "event_data": {"host": "n1", "msg": "fetched the bundle"}},
              {"event": "runner_on_ok", "event_data": {"host": "n1", "task": "Install rdma-core", "role": "rdma",
                                                       "task_action": "apt", "res": {"changed": True}}},
              {"event": "probes", "event_data": {"rows": [{"probe": "gpu_answers", "status": "pass", "detail": ""}]}},
              {"event": "done", "event_data": {"rc": 0, "converge_s": 12.5, "probes_s": 2.0,
                                               "manifest": {"digest": "a" * 64, "items": 3}}}]
    return json.dumps({"from": 0, "events": events}).encode()


def test_only_bad_report_escapes_the_report_checker_on_mutated_batches() -> None:
    rng = random.Random(54)
    base = json.loads(_recorded_report())
    for number in range(EXAMPLES):
        if number % 3 == 0:  # the bytes themselves
            raw = bytearray(_recorded_report())
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            body = bytes(raw)
        else:
            body = json.dumps(_mutate_value(rng, base)).encode()
        try:
            check_report(body)
        except BadReport:
            pass
