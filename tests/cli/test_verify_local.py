"""`gpuprov verify --local`: the probes on this machine, no cluster, no SSH.

Bad input is one line and exit 2 with nothing run or kept; the real runs probe the machine
the suite runs on (testinfra's local connection), so what a GPU probe must say is read off
this machine's own PCI bus first (no GPU: the GPU probes skip, each with its reason).
"""

from __future__ import annotations

import json
import os
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprov.probes.localhost import read_pci_bus
from gpuprov.probes.run import check_groups
from tests.conftest import invoke, run_cli

# The GPU probes that need a GPU to say anything (test_gpu.py): with none expected they skip.
NEEDS_A_GPU = ["nvidia_smi_sees_gpus", "driver_version_persistence_and_model",
               "cuda_context_can_be_created", "running_kernel_module_flavour_matches_the_lock"]
# No probe that runs a container (it could pull a CUDA image): fast, and nothing downloaded.
NO_CONTAINERS = "gpu and not containers and not images"
GPUS_HERE = len(read_pci_bus()["gpu_device_ids"])


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty state directory and temporary directory, for this process and a subprocess."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("GPUPROV_HOME", str(home))
    monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "no-settings.toml"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    return {**os.environ, "GPUPROV_HOME": str(home), "TMPDIR": str(tmp)}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "verify needs a cluster NAME, or --local"),
        (["demo", "--local"], "a cluster NAME or --local, not both"),
        (["demo", "--gpus", "2"], "--gpus: only with --local"),
        (["demo", "--type", "p4d.24xlarge", "--driver", "580"], "--type, --driver: only with --local"),
        (["demo", "-o", "junit"], "-o junit: only with --local"),
        (["--local", "--gpus", "-1"], "-1 is not in the range 0<=x<=64"),
        (["--local", "--gpus", "two"], "'two' is not a valid integer"),
        (["--local", "--type", "p4d.24xl"], "did you mean p4d.24xlarge"),
        (["--local", "--type", "p4d.24xlarge", "--gpus", "8"], "exclude each other"),
        (["--local", "--gpu-model", "H100"], "needs --gpus N"),
        (["--local", "--gpus", "0", "--gpu-model", "H100"], "a machine without GPU has no GPU model"),
        (["--local", "--gpus", "2", "--gpu-model", "Z9000"], "unknown GPU model 'Z9000'; known GPUs: "),
        (["--local", "--gpus", "0", "--driver", "999"], "driver branch 999"),
        (["--local", "--gpus", "0", "--cuda", "12.8"], "has no CUDA 12.8 (available: "),
        (["demo", "--cuda", "13.0"], "--cuda: only with --local"),
        (["--local", "--only", "gpux"], "unknown probe group 'gpux'"),
        (["--local", "-o", "xml"], "'xml' is not one of"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_runs_nothing(capsys, scratch, args, needle) -> None:
    code, out, err = invoke(capsys, "verify", *args)
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: ") and needle in lines[0], err
    assert files_under(Path(scratch["GPUPROV_HOME"])) == []
    assert list(Path(scratch["TMPDIR"]).iterdir()) == []  # no probe run began


@pytest.mark.parametrize(
    ("expr", "why"),
    [("gpu and", "incomplete"), ("(gpu", "unbalanced"), ("gpu)", "unexpected ')'"), ("GPU", "unknown")],
)
def test_probe_groups_are_checked(expr: str, why: str) -> None:
    with pytest.raises(Exception, match=re.escape(why)):
        check_groups(expr)
    assert check_groups("(driver or cuda) and not images") == "( driver or cuda ) and not images"


def _rows(proc) -> dict[str, dict[str, str]]:
    data = json.loads(proc.stdout)
    assert data["cluster"] == "local" and list(data["hosts"]) == [socket.gethostname()], data
    rows = data["hosts"][socket.gethostname()]
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("pass", "fail", "skip")}
    assert data["summary"] == counts and rows
    # The exit code and `ok` follow the rows: 1 and false exactly when one failed.
    assert data["ok"] is (counts["fail"] == 0)
    assert proc.returncode == (1 if counts["fail"] else 0), proc.stderr
    assert all(r["detail"] for r in rows), "every row says what was found or why it skipped"
    return {r["probe"]: r for r in rows}


def test_gpus_0_runs_every_probe_here_and_the_gpu_probes_skip_with_their_reason(scratch) -> None:
    proc = run_cli("verify", "--local", "--gpus", "0", "-o", "json", env=scratch, timeout=120)
    rows = _rows(proc)
    assert "expecting 0 x NVIDIA GPU (--gpus)" in proc.stderr and "lock " in proc.stderr
    assert {"os_supported", "gpus_on_pci_bus", "docker_active", *NEEDS_A_GPU} <= set(rows)
    count = rows["gpus_on_pci_bus"]
    if GPUS_HERE == 0:
        assert count["status"] == "pass" and re.search(r"\b0 NVIDIA GPU", count["detail"]), count
        for probe in NEEDS_A_GPU:
            assert rows[probe]["status"] == "skip" and "no GPU" in rows[probe]["detail"], rows[probe]
    else:  # --gpus 0 on a machine with GPUs: the count says so
        assert count["status"] == "fail" and f"found {GPUS_HERE}" in count["detail"], count
    # Nothing kept: no state, no run directory.
    assert files_under(Path(scratch["GPUPROV_HOME"])) == []
    assert list(Path(scratch["TMPDIR"]).iterdir()) == []


def test_a_type_this_machine_is_not_fails_the_gpu_count(scratch) -> None:
    if GPUS_HERE == 8:
        pytest.skip("this machine has 8 GPUs: it could be a p4d.24xlarge")
    proc = run_cli("verify", "--local", "--type", "p4d.24xlarge", "--only", NO_CONTAINERS, "-o", "json",
                   env=scratch, timeout=120)
    rows = _rows(proc)
    assert proc.returncode == 1
    count = rows["gpus_on_pci_bus"]
    assert count["status"] == "fail", count
    assert re.search(rf"expected 8 NVIDIA GPU.*\(p4d\.24xlarge\), found {GPUS_HERE}\b", count["detail"]), count
    assert "expecting p4d.24xlarge (catalog): 8 x A100" in proc.stderr
    # A probe's failed assertion is its own message, not the CommandResult pytest explains it with.
    cuda = rows["cuda_context_can_be_created"]
    assert cuda["status"] == "fail" and not cuda["detail"].startswith("command failed"), cuda
    # Only the probes asked for ran.
    assert not {"docker_active", "docker_run_gpus_all_sees_the_gpus", "os_supported"} & set(rows)


def test_without_type_or_gpus_the_count_is_not_passed_unlooked(scratch) -> None:
    proc = run_cli("verify", "--local", "--only", NO_CONTAINERS, "-o", "json", env=scratch, timeout=120)
    count = _rows(proc)["gpus_on_pci_bus"]
    # Never a pass: nothing said how many GPUs this machine should have.
    assert count["status"] == "skip" and f"found {GPUS_HERE}" in count["detail"], count
    assert "no GPU count (neither --type nor --gpus given)" in proc.stderr


def test_junit_is_pytests_xml_on_stdout(scratch) -> None:
    proc = run_cli("verify", "--local", "--gpus", "0", "--only", NO_CONTAINERS, "-o", "junit",
                   env=scratch, timeout=120)
    root = ET.fromstring(proc.stdout)
    cases = root.findall(".//testcase")
    failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = {c.get("name", "").split("[")[0] for c in cases if c.find("skipped") is not None}
    assert {c.get("name", "").split("[")[0] for c in cases} >= {"test_gpus_on_pci_bus", *(
        f"test_{p}" for p in NEEDS_A_GPU)}
    assert proc.returncode == (1 if failed else 0), proc.stderr
    if GPUS_HERE == 0:
        assert skipped >= {f"test_{p}" for p in NEEDS_A_GPU}, skipped


def test_not_root_is_said_in_one_line(capsys, scratch, monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code, out, err = invoke(capsys, "verify", "--local", "--gpus", "0", "--only", "base", "-o", "json")
    notes = [line for line in err.splitlines() if "not running as root" in line]
    assert len(notes) == 1 and "(uid 1000)" in notes[0], err
    assert code == (0 if json.loads(out)["ok"] else 1)
