"""The gpu_sharing role's node program (roles/gpu_sharing/files/gpu_sharing.py) run here for real,
against the FIXTURE nvidia-smi (tests/fixtures/mig_nvidia_smi.py) answering from the recorded
H100 (no GPU here), with a stand-in systemctl: the plan it prints, the steps it takes once, the
values it refuses. The role's molecule scenario runs the same on a node, through the role."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "gpu_sharing" / "files" / "gpu_sharing.py"
RECORDED = ROOT / "tests" / "fixtures" / "recordings" / "h100-sxm5-580"
ONE_G = ["--sharing", "mig:all-1g.10gb", "--instance", "1g.10gb=7"]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, str]:
    """PATH with the FIXTURE nvidia-smi and a systemctl for which no service runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(ROOT / "tests" / "fixtures" / "mig_nvidia_smi.py", bin_dir / "nvidia-smi")
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 3\n")  # is-active: inactive
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    shutil.copy(RECORDED / "nvidia-smi-q.txt", tmp_path / "nvidia-smi-q.txt")
    shutil.copy(RECORDED / "mig.txt", tmp_path / "mig-lgip.txt")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUPROV_FIXTURE_SMI_DIR": str(tmp_path)}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM), *args], capture_output=True, text=True, env=env,
                          check=False, timeout=60)


def _steps(env: dict[str, str], *args: str) -> list[str]:
    out = _run(env, *args, "--json")
    assert out.returncode == 0, out.stderr
    return [s["command"] for s in json.loads(out.stdout)["steps"]]


def test_the_recorded_h100_plans_the_mig_layout_applies_it_once_and_then_plans_nothing(node) -> None:
    steps = _steps(node, "plan", *ONE_G, "--client", "slurmd", "--driver-client", "nvidia-persistenced")
    assert steps == ["systemctl stop slurmd", "systemctl stop nvidia-persistenced", "nvidia-smi -i 0 -mig 1",
                     "nvidia-smi --gpu-reset -i 0", "nvidia-smi mig -i 0 -cgi " + ",".join(["1g.10gb"] * 7) + " -C",
                     "systemctl start nvidia-persistenced", "systemctl start slurmd"]
    log = Path(node["GPUPROV_FIXTURE_SMI_DIR"]) / "calls.log"
    assert not log.exists(), "plan changed the GPU"
    assert _steps(node, "apply", *ONE_G)[7:10] == steps[2:5]  # the default clients: 5, and 2 of the driver
    assert log.read_text().splitlines() == [s for s in steps if s.startswith("nvidia-smi")]
    assert _steps(node, "apply", *ONE_G) == [] and _steps(node, "plan", *ONE_G) == []


def test_without_a_gpu_it_says_so_and_plans_nothing(node) -> None:
    out = json.loads(_run(node, "apply", *ONE_G, "--nvidia-smi", "/nonexistent/nvidia-smi", "--json").stdout)
    assert out["gpus"] == 0 and out["steps"] == [] and "no NVIDIA driver" in out["no_gpu"]
    # A layout whose instances are not given: fine without a GPU, refused on one with MIG.
    assert _run(node, "plan", "--sharing", "mig:all-1g.10gb", "--nvidia-smi", "/nonexistent/nvidia-smi").returncode == 0
    refused = _run(node, "plan", "--sharing", "mig:all-1g.10gb")
    assert refused.returncode == 1 and "instances per GPU are not given" in refused.stderr


@pytest.mark.parametrize("args", [
    ["--sharing", "mig:all;reboot", "--instance", "1g.10gb=7"],
    ["--sharing", "mps\n"],
    ["--sharing", "shard:65"],
    ["--sharing", "mig:all-1g.10gb", "--instance", "1g.10gb=8"],
    ["--sharing", "mig:all-1g.10gb", "--instance", "1g.10gb -dgi=7"],
    ["--sharing", "mig:all-1g.10gb", "--instance", "1g.10gb=4", "--instance", "2g.20gb=4"],
    ["--sharing", "mps", "--instance", "1g.10gb=7"],
    ["--sharing", "mps", "--client", "slurmd; reboot"],
    ["--sharing", "mps", "--nvidia-smi", "-i"],
])
def test_a_value_of_another_form_is_refused_before_anything_runs(node, args: list[str]) -> None:
    out = _run(node, "apply", *args)
    assert out.returncode == 2 and "error:" in out.stderr
    assert not (Path(node["GPUPROV_FIXTURE_SMI_DIR"]) / "state.json").exists()
