"""`gpuprov health` on the command line: bad input is one line and exit 2 with nothing
created; `--local` checks this machine for real (this suite's machine has no GPU: the GPU
checks skip, each with its reason); the JSON and JUnit XML shapes; `status` shows the last
health run."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprov.health import QUICK
from gpuprov.probes.localhost import read_pci_bus
from tests.conftest import invoke

CHECKS = [c.__name__.replace("xids", "xid") for c in QUICK]
GPUS_HERE = len(read_pci_bus()["gpu_device_ids"])


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "no-settings.toml"))
    return tmp_path / "home"


@pytest.mark.parametrize(("args", "needle"), [
    ([], "health needs a cluster NAME, or --local"),
    (["demo", "--local"], "a cluster NAME or --local, not both"),
    (["demo", "--gpus", "2"], "--gpus: only with --local"),
    (["--local", "--node", "n1"], "--node: only with a cluster NAME"),
    (["--local", "--level", "Full"], "--level Full: one of quick, standard, full"),
    (["--local", "--level", "fast"], "--level fast: one of quick, standard, full"),
    (["--local", "--type", "p9.huge"], "unknown instance type 'p9.huge'"),
    (["--local", "--type", "p5.48xlarge", "--gpus", "8"], "--type and --gpus/--gpu-model exclude each other"),
    (["--local", "--gpu-model", "H100"], "--gpu-model H100 needs --gpus N"),
    (["nosuch"], "unknown cluster 'nosuch'"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_created(capsys, home: Path, args, needle) -> None:
    code, out, err = invoke(capsys, "health", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*") if p.name != "state.db")


@pytest.mark.skipif(GPUS_HERE > 0, reason="this machine has a GPU: the skips below are for one without")
def test_local_here_skips_the_gpu_checks_with_reasons_and_runs_the_rest(capsys, home: Path) -> None:
    code, out, err = invoke(capsys, "health", "--local", "-o", "json")
    data = json.loads(out)
    rows = {r["check"]: r for r in data["checks"]}
    assert list(rows) == CHECKS and data["cluster"] == "local" and data["level"] == "quick"
    for check in ("gpu_answers", "driver", "nvlink", "ecc", "row_remap", "clocks", "temperature", "peermem"):
        assert rows[check]["status"] == "skip" and "no NVIDIA GPU on the PCI bus" in rows[check]["reason"]
    # memlock is read for real: its verdict is this machine's own limits.
    limits = os.popen("runuser -u nobody -- sh -c 'ulimit -l; ulimit -Hl' 2>/dev/null").read().split()
    if rows["memlock"]["status"] != "skip":
        assert (rows["memlock"]["status"] == "pass") == (limits == ["unlimited", "unlimited"])
    assert code == (1 if data["summary"]["fail"] else 0)
    assert "health --local:" in err and not home.exists()


def test_local_with_a_type_fails_the_missing_gpus_and_prints_junit(capsys, home: Path) -> None:
    code, out, _ = invoke(capsys, "health", "--local", "--type", "p5.48xlarge", "-o", "junit")
    assert code == 1
    root = ET.fromstring(out)
    suite = root.find("testsuite")
    assert suite is not None and int(suite.get("tests", "0")) == len(CHECKS)
    cases = {c.get("name", "").split(".", 1)[1]: c for c in suite.iter("testcase")}
    assert list(cases) == CHECKS
    failure = cases["gpu_count"].find("failure")
    if GPUS_HERE < 8:
        assert failure is not None and "expected: 8 x H100 (p5.48xlarge)" in (failure.text or "")
        assert "action: reboot the node" in (failure.text or "")
    assert cases["peermem"].find("skipped") is not None  # p5 uses EFA


def test_the_table_names_node_check_found_expected_and_action(capsys, home: Path) -> None:
    code, out, _ = invoke(capsys, "health", "--local", "--gpus", "8", "--gpu-model", "H100")
    assert code == 1
    assert "health local (quick):" in out
    for column in ("node", "check", "status", "found", "expected", "action"):
        assert column in out


def test_status_shows_the_last_health_run_in_one_line(capsys, home: Path) -> None:
    from gpuprov.cli import output as cli_output
    from gpuprov.state import Store

    store = Store()
    store.create_cluster("c1", "docker", {})
    cli_output.health_line("c1")
    assert capsys.readouterr().out.strip() == "health: never checked (`gpuprov health c1`)"
    first = store.start_run("c1", "health", None)
    store.finish_run(first, True, {"level": "quick", "pass": 3, "fail": 0, "skip": 10, "failed": []})
    run = store.start_run("c1", "health", None)
    store.finish_run(run, False, {"level": "quick", "pass": 2, "fail": 1, "skip": 10,
                                  "failed": ["c1-node-1: memlock (re-apply the rdma role)"]})
    store.finish_run(store.start_run("c1", "provision", None), True, {})
    cli_output.health_line("c1")
    line = capsys.readouterr().out.strip()
    assert line.startswith("health (quick, ") and "): FAILED, 2 pass, 1 fail, 10 skip" in line
    assert line.endswith("failing: c1-node-1: memlock (re-apply the rdma role)")
