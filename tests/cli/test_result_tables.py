"""`verify` and `health` for people: the PASS and FAIL rows, one line per skip reason with what
it covers, the counts again at the end with the next step; `--all` every row; JSON keeps every
row. Built from a recorded run (the H200's verify --local, as two nodes) and from fakes."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from gpuprov import ssh
from gpuprov.cli import output as cli_output
from gpuprov.probes import run as probes
from gpuprov.results.shapes import HealthCheck, HealthResult, ProbeRow, VerifyResult, VerifySummary
from gpuprov.state import NodeRecord, Store
from tests.conftest import invoke

RECORDED = (Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "h200-580" / "gpuprov-2026-11-27"
            / "verify-local.json")
SLURM = "no Slurm on this node (no /etc/slurm/slurm.conf): a cluster without a scheduler"


def recorded_on_two_nodes() -> VerifyResult:
    text = RECORDED.read_text()
    doc, _ = json.JSONDecoder().raw_decode(text[text.index("\n{") + 1:])  # after the command line
    rows = [ProbeRow.of(r) for r in doc["hosts"]["vm"]]
    count = {k: 2 * sum(r.status == k for r in rows) for k in ("pass", "fail", "skip")}
    return VerifyResult(cluster="demo", ok=False, hosts={"demo-node-1": rows, "demo-node-2": rows},
                        summary=VerifySummary(pass_=count["pass"], fail=count["fail"], skip=count["skip"]))


def statuses(out: str) -> list[str]:
    """The status of each row printed (boxed, or with its detail under it)."""
    return [line.replace("│", " ").split()[2] for line in out.splitlines()
            if line.replace("│", " ").strip().startswith("demo-node-")]


def test_verify_prints_pass_and_fail_rows_then_each_skip_reason_once(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    cli_output.verify_table("demo", recorded_on_two_nodes())
    out = capsys.readouterr().out
    lines = out.splitlines()
    seen = statuses(out)
    assert seen == ["PASS"] * 16 + ["FAIL"] * 66  # the FAIL rows last, next to the counts
    assert f"SKIP 9 probes on 2 nodes (demo-node-1, demo-node-2): {SLURM}" in lines
    assert ("SKIP efa_interfaces_match_the_catalog on 2 nodes (demo-node-1, demo-node-2): this node has no EFA "
            "(catalog)") in lines
    assert sum(line.startswith("SKIP ") for line in lines) == 4
    assert lines[0] == "verify demo: 16 pass, 66 fail, 24 skip"
    assert lines[-1].startswith("verify demo: 16 pass, 66 fail, 24 skip: FAILED; next: fix what the FAIL rows "
                                "name (`gpuprov provision demo` converges the nodes again), then `gpuprov verify demo`")


def test_verify_all_prints_every_row(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    cli_output.verify_table("demo", recorded_on_two_nodes(), every=True)
    out = capsys.readouterr().out
    assert sorted(statuses(out)) == sorted(["PASS"] * 16 + ["FAIL"] * 66 + ["SKIP"] * 24)
    assert not any(line.startswith("SKIP ") for line in out.splitlines())


def health(rows: list[HealthCheck]) -> HealthResult:
    count = {k: sum(r.status == k for r in rows) for k in ("pass", "fail", "skip")}
    return HealthResult(cluster="demo", level="quick", ok=not count["fail"], started="t0", finished="t1",
                        checks=rows, summary=VerifySummary(pass_=count["pass"], fail=count["fail"],
                                                           skip=count["skip"]))


NO_GPU = "no NVIDIA GPU on the PCI bus (and none expected)"
ROWS = [HealthCheck(node, check, "skip", "", "", "", reason=NO_GPU)
        for node in ("demo-node-1", "demo-node-2") for check in ("gpu_answers", "driver", "nvlink", "ecc")] + [
    HealthCheck("demo-node-1", "memlock", "pass", "unlimited", "unlimited", ""),
    HealthCheck("demo-node-2", "memlock", "fail", "65536", "unlimited", "re-apply the rdma role"),
    HealthCheck("demo-node-2", "efa", "skip", "", "", "", reason="this type has no EFA")]


def test_health_prints_each_skip_reason_once_and_the_counts_with_the_next_step(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    cli_output.health_table(health(ROWS))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert f"SKIP 4 checks on 2 nodes (demo-node-1, demo-node-2): {NO_GPU}" in lines
    assert "SKIP efa on demo-node-2: this type has no EFA" in lines
    assert lines[-1] == ("health demo (quick): 1 pass, 1 fail, 9 skip: FAILED; next: the action of each FAIL row, "
                         "then `gpuprov health demo` (`gpuprov health demo --all`: every row)")
    cli_output.health_table(health(ROWS), every=True)
    assert statuses(out) == ["PASS", "FAIL"] and sorted(statuses(capsys.readouterr().out)) == sorted(
        ["PASS", "FAIL"] + ["SKIP"] * 9)


def test_health_under_up_with_nothing_failed_is_the_count_line_alone(capsys) -> None:
    passed = [r for r in ROWS if r.status != "fail"]
    cli_output.health_table(health(passed), failing_only=True)
    assert capsys.readouterr().out == "health demo (quick): 1 pass, 0 fail, 9 skip\n"
    cli_output.health_table(health(ROWS), failing_only=True)
    out = capsys.readouterr().out
    assert "memlock" in out and "re-apply the rdma role" in out and "unlimited" in out and "SKIP" not in out


@pytest.fixture
def rack(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    store = Store()
    store.create_cluster("rack", "static", {"instance_type": "g5.xlarge"})
    store.replace_nodes("rack", [
        NodeRecord(name=n, id=n, address=f"192.0.2.{i}", ssh_port=22, user="root", state="reachable",
                   zone="static", instance_type="g5.xlarge") for i, n in enumerate(("n1", "n2"), 1)])
    monkeypatch.setattr(ssh, "unreachable_nodes", lambda nodes, key, known: {})

    def run_probes(inventory: Path, cfg: Path, hosts: list[str], expect: Any, run_dir: Path,
                   **kw: Any) -> dict[str, list[dict[str, str]]]:
        return {h: [{"probe": "gpu_count", "status": "skip", "detail": "no GPU in a test"},
                    {"probe": "held_packages", "status": "pass", "detail": "ok"}] for h in hosts}

    monkeypatch.setattr(probes, "run_probes", run_probes)
    return "rack"


def test_verify_command_counts_skips_and_all_and_json_keep_every_row(capsys, rack: str) -> None:
    code, out, _ = invoke(capsys, "verify", rack)
    rows = [line.replace("│", " ").split() for line in out.splitlines() if line.strip("│ ").startswith("n")]
    assert code == 0 and "SKIP gpu_count on 2 nodes (n1, n2): no GPU in a test" in out.splitlines()
    assert [r[:3] for r in rows] == [["n1", "held_packages", "PASS"], ["n2", "held_packages", "PASS"]]
    assert out.splitlines()[-1] == "verify rack: 2 pass, 0 fail, 2 skip: ok (`gpuprov verify rack --all`: every row)"
    code, out, _ = invoke(capsys, "verify", rack, "--all")
    assert code == 0 and out.count(" SKIP ") == 2 and "SKIP gpu_count on" not in out
    code, out, _ = invoke(capsys, "verify", rack, "-o", "json")
    assert [r["status"] for r in json.loads(out)["hosts"]["n1"]] == ["skip", "pass"]


def test_a_branch_past_its_end_of_life_is_a_short_field_of_status_and_not_said_by_verify(
        capsys, rack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.lock import drivers, stack

    monkeypatch.setattr(drivers, "today", lambda: date(2026, 12, 1))  # R535 past its end of life (2026-06)
    Store().set_lock(rack, stack.resolve("p4d.24xlarge", driver="535").as_dict())
    code, out, err = invoke(capsys, "status", rack)
    assert code == 0 and "driver: R535, end of life 2026-06 (see gpuprov stack)" in out.splitlines()
    assert "warning" not in err and "reached its end of life" not in out
    code, out, err = invoke(capsys, "status", rack, "-o", "json")
    assert json.loads(out)["driver_eol"].startswith("driver branch R535 (long-term) reached its end of life in 2026-06")
    assert err == ""
    code, out, err = invoke(capsys, "verify", rack)
    assert code == 0 and "end of life" not in out + err
