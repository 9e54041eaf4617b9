"""The suite's closing lines (tests/suite_budget.py): the machine, the time, the slowest units,
and a run past its budget saying so."""

from __future__ import annotations

from pathlib import Path

from tests.suite_budget import budget_minutes, cpu_model, cpu_share, cpu_times, report, speed_probe, timeline

UNITS = {f"tests/e2e/test_{i}.py": float(i * 10) for i in range(1, 13)}


def test_the_budget_follows_the_cpu_kind() -> None:
    assert budget_minutes("AMD EPYC")[0] == 45
    assert budget_minutes("AMD EPYC 7R13 Processor")[0] == 45
    assert budget_minutes("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz")[0] == 20
    assert budget_minutes("Apple M2") == (45, "a CPU of neither kind: the slow kind's")


def test_the_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n\nprocessor\t: 1\n"
                    "model name\t: AMD EPYC\n")
    assert cpu_model(info) == "AMD EPYC"
    assert cpu_model(tmp_path / "missing") == "unknown"
    assert cpu_model(Path("/proc/cpuinfo")) != ""


def test_a_run_over_budget_says_so_in_its_last_line() -> None:
    lines = report(UNITS, 50 * 60.0, "1000", model="AMD EPYC", cores=2, now=1000 + 52 * 60)
    assert lines[1] == "the suite's time (tests/suite_budget.py): AMD EPYC, 2 cores"
    assert "  make test in all (set-up and lint included): 52.0 min" in lines
    slowest = [ln.split()[-1] for ln in lines if ln.startswith("    ")]
    assert slowest == [f"tests/e2e/test_{i}.py" for i in range(12, 2, -1)]
    assert lines[-1].startswith("  OVER BUDGET: 52.0 min against 45 on this machine (AMD EPYC)")


def test_a_run_within_budget_says_that_too() -> None:
    lines = report(UNITS, 15 * 60.0, None, model="Intel(R) Xeon(R) CPU", cores=2)
    assert lines[-1] == "  within budget: 15.0 min of 20 on this machine (Intel(R) Xeon)"
    assert not [ln for ln in lines if "in all" in ln]


def test_a_unit_past_a_quarter_of_the_budget_is_named_and_the_other_kind_is_estimated() -> None:
    units = {"tests/e2e/test_docker_cluster.py": 974.0, "tests/e2e/test_baked_cluster.py": 577.0}
    lines = report(units, 38 * 60.0, "1000", model="AMD EPYC", cores=2, now=1000 + 39.4 * 60)
    assert [ln for ln in lines if "LONG UNIT" in ln] == [
        "  LONG UNIT: tests/e2e/test_docker_cluster.py took 974 s, more than a quarter of the budget "
        "(675 s): split it or cut its work"]
    assert "  on the other kind (Intel(R) Xeon), at 1.7 times (an estimate, not a run there): about 23.2 min of its 20" in lines
    assert lines[-1] == "  within budget: 39.4 min of 45 on this machine (AMD EPYC)"
    intel = report({}, 15 * 60.0, None, model="Intel(R) Xeon(R) CPU", cores=2)
    assert "  on the other kind (AMD EPYC), at 1.7 times (an estimate, not a run there): about 25.5 min of its 45" in intel
    assert not [ln for ln in report(units, 60.0, None, model="Apple M2", cores=8) if "other kind" in ln]


def test_the_machines_speed_and_the_e2e_strategy_are_named_when_given() -> None:
    lines = report(UNITS, 30 * 60.0, None, model="AMD EPYC", cores=2, strategy="mitogen", speed_s=0.87)
    assert lines[2] == ("  this machine's speed: 5 M additions in a Python loop in 0.87 s "
                        "(one core, at the end of the run)")
    assert lines[3] == "  the e2e units' Ansible strategy: mitogen (the node from scratch: linear)"
    assert not [ln for ln in report(UNITS, 60.0, None, model="AMD EPYC", cores=2) if "speed" in ln]


def test_the_speed_probe_measures_its_loop() -> None:
    short, long = speed_probe(10_000), speed_probe(1_000_000)
    assert 0 < short < long


def test_the_cores_share_of_the_run_comes_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 10 50 800 20 5 15 0 0 0\ncpu0 1 2 3 4 5 6 7\n")
    before = cpu_times(stat)
    assert before == {"user": 110, "system": 70, "idle": 800, "iowait": 20}
    stat.write_text("cpu  500 10 150 1000 20 5 15 0 0 0\n")
    assert cpu_share(before, cpu_times(stat)) == (
        "  the machine's cores over the tests: user 57 %, system 14 %, idle 29 %, waiting for I/O 0 %")
    assert cpu_times(tmp_path / "missing") is None and cpu_share(None, before) is None
    assert cpu_times(Path("/proc/stat")) is not None


def test_the_timeline_names_each_long_unit_with_its_worker_in_start_order() -> None:
    spans = {"a.py": (1000.0, 1400.0, "gw0"), "b.py": (1010.0, 1100.0, "gw1"), "c.py": (1100.0, 1110.0, "gw1")}
    assert timeline(spans) == ["  when each unit ran (s from the first test; worker):",
                               "         0 ..    400   gw0  a.py",
                               "        10 ..    100   gw1  b.py"]
    assert timeline({}) == []
