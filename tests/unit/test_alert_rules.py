"""The monitoring role's alert rules, proven by Prometheus's own promtool: the rules load
(`promtool check rules`) and each alert fires on synthetic series where it should and stays
quiet where it should not (`promtool test rules`, roles/monitoring/files/gpu-alerts.test.yml).

promtool comes from Debian's `prometheus` package, which `make host-setup`
(scripts/host-setup.sh) installs: a machine without it fails here rather than skipping."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuprov.health import xid

FILES = Path(__file__).resolve().parents[2] / "roles" / "monitoring" / "files"
RULES = FILES / "gpu-alerts.yml"
RULE_TESTS = FILES / "gpu-alerts.test.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: `make host-setup` installs it (Debian's prometheus package)")
    return path


def _run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def _alerts() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def test_the_rules_load(promtool: str) -> None:
    proc = _run(promtool, "check", "rules", RULES.name, cwd=FILES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in proc.stdout, proc.stdout


def test_every_alert_fires_and_stays_quiet_as_the_tests_say(promtool: str) -> None:
    proc = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=FILES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout, proc.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases: dict[str, set[str]] = {name: set() for name in _alerts()}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            assert case["alertname"] in cases, f"a test of an alert the rules lack: {case['alertname']}"
            cases[case["alertname"]].add("fires" if case.get("exp_alerts") else "quiet")
    lacking = {name: sorted({"fires", "quiet"} - seen) for name, seen in cases.items() if seen != {"fires", "quiet"}}
    assert lacking == {}, f"alerts without a firing or a quiet case: {lacking}"


def test_the_seeds_alert_is_85_degrees_for_5_minutes() -> None:
    rule = _alerts()["GpuTemperatureHigh"]
    assert rule["expr"].strip() == "max by (instance, gpu) (DCGM_FI_DEV_GPU_TEMP) > 85" and rule["for"] == "5m"


def test_critical_xids_are_gpuprovs_reset_reboot_and_isolate_xids() -> None:
    """The alert's Xids are exactly those gpuprov's table (gpuprov/health/xid.py) acts on; Xid
    154 carries its action in the log line only, so it is gpuprov health's to classify."""
    in_rule = {int(n) for n in re.findall(r"DCGM_FI_DEV_XID_ERRORS == (\d+)", _alerts()["GpuXidCritical"]["expr"])}
    acted_on = {code for code, (_, action) in xid.XIDS.items() if action != "watch" and code != 154}
    assert in_rule == acted_on


def test_a_broken_rule_fails_the_rule_tests(promtool: str, tmp_path: Path) -> None:
    """The rule tests can fail: the same tests against a rule moved to 95 °C do."""
    broken = RULES.read_text().replace("(DCGM_FI_DEV_GPU_TEMP) > 85", "(DCGM_FI_DEV_GPU_TEMP) > 95")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    proc = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0 and "GpuTemperatureHigh" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_rules_that_count_mig_instances_as_gpus_fail_the_mig_cases(promtool: str, tmp_path: Path) -> None:
    """The MIG cases can fail: read per series (as before MIG was looked at), the hot GPU with
    three instances is three alerts, and the GPU whose seven instances became one is missing."""
    per_series = RULES.read_text().replace("max by (instance, gpu) (DCGM_FI_DEV_GPU_TEMP) > 85",
                                           "DCGM_FI_DEV_GPU_TEMP > 85")
    per_series = per_series.replace("count by (instance) (max by (instance, gpu) (DCGM_FI_DEV_GPU_TEMP))",
                                    "count by (instance) (DCGM_FI_DEV_GPU_TEMP)")
    assert per_series.count("count by (instance) (DCGM_FI_DEV_GPU_TEMP)") == 2
    (tmp_path / RULES.name).write_text(per_series)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    proc = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "a hot GPU with three MIG instances is one alert" in out, out
    assert "a MIG layout change is no GPU missing" in out, out
