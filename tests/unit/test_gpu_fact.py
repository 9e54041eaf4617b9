"""gpu.fact (roles/gpuprov_base/files) on recorded PCI buses of real machines: it names the GPUs
from gpuprov's own device-id table first, then from lspci's machine-readable form, and counts
GPUs and NVSwitches right (tests/fixtures/recordings/README.md names each recording's source)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import catalog

ROOT = Path(__file__).resolve().parents[2]
FACT = ROOT / "roles" / "gpuprov_base" / "files" / "gpu.fact"
RECORDINGS = ROOT / "tests" / "fixtures" / "recordings"


def _tree(recording: Path, dest: Path) -> Path:
    """A sysfs PCI tree (vendor, device, class files) from a recorded `pci.txt` census."""
    for line in recording.read_text().splitlines():
        match = re.match(r"/sys/bus/pci/devices/(\S+) vendor=(\S+) device=(\S+) class=(\S+)", line)
        if match:
            dev = dest / match.group(1)
            dev.mkdir(parents=True)
            for name, value in zip(("vendor", "device", "class"), match.groups()[1:], strict=True):
                (dev / name).write_text(value + "\n")
    return dest


def _lspci(recording: Path | None, bindir: Path) -> str:
    """A PATH whose `lspci` prints a recorded lspci output (its command line and exit
    lines taken off), or has no lspci at all."""
    bindir.mkdir()
    if recording is not None:
        body = [ln for ln in recording.read_text().splitlines()
                if not ln.startswith("$ ") and not re.fullmatch(r"\[exit \d+\]", ln)]
        out = bindir / "lspci.out"
        out.write_text("\n".join(body) + "\n")
        script = bindir / "lspci"
        script.write_text(f"#!/bin/sh\ncat {out}\n")
        script.chmod(0o755)
    return f"{bindir}:/usr/bin:/bin"


def run_fact(tmp_path: Path, pci: str, lspci: str | None) -> dict:
    tree = _tree(RECORDINGS / pci, tmp_path / "pci")
    path = _lspci(RECORDINGS / lspci if lspci else None, tmp_path / "bin")
    out = subprocess.run([sys.executable, str(FACT)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PATH": path, "GPU_FACT_PCI_DEVICES": str(tree)})
    return json.loads(out.stdout)


@pytest.mark.parametrize("lspci", [None, "h100-sxm5-580/lspci-vmmD.txt"], ids=["no-lspci", "lspci"])
def test_the_recorded_h100_is_named_h100(tmp_path: Path, lspci: str | None) -> None:
    data = run_fact(tmp_path, "h100-sxm5-580/pci.txt", lspci)
    assert data["gpu_count"] == 1 and data["nvswitch_count"] == 0
    assert data["models"] == ["H100"]
    gpu = data["gpus"][0]
    assert gpu["pci"] == "0000:00:06.0" and gpu["device_id"] == "0x2330"
    # lspci's own name, whole (the old `-mm` parser broke it on `-ra1 -p00`).
    assert gpu.get("name") == ("GH100[H100 SXM5 80GB]" if lspci else None)


@pytest.mark.parametrize("lspci", [None, "h200-580/lspci-vmmnn.txt"], ids=["no-lspci", "lspci"])
def test_the_recorded_h200_is_named_h200_though_debians_pci_ids_lags(tmp_path: Path, lspci: str | None) -> None:
    """Debian 12's pci.ids calls it `Device [2335]` (the `-vmmnn` form of the same bus, which
    the parser reads as well: slots without a domain, names with ids): the table wins."""
    data = run_fact(tmp_path, "h200-580/pci.txt", lspci)
    assert data["models"] == ["H200"]
    assert data["gpus"][0].get("name") == ("Device [2335]" if lspci else None)


def test_an_hgx_board_counts_eight_gpus_and_four_nvswitches(tmp_path: Path) -> None:
    data = run_fact(tmp_path, "hgx-h100-8gpu-edited/pci.txt", None)
    assert data["gpu_count"] == 8 and data["nvswitch_count"] == 4
    assert data["models"] == ["H100"]
    assert catalog.from_hardware({"gpu_device_ids": [g["device_id"] for g in data["gpus"]],
                                  "nvswitches": data["nvswitch_count"]}).nvswitch is True


def test_a_gpu_outside_the_table_takes_lspcis_name_then_its_id(tmp_path: Path) -> None:
    edited = tmp_path / "pci.txt"  # the H100 recording with its device id changed to one no table knows
    edited.write_text((RECORDINGS / "h100-sxm5-580/pci.txt").read_text().replace("device=0x2330", "device=0x2bff"))
    tree = _tree(edited, tmp_path / "pci")
    out = subprocess.run([sys.executable, str(FACT)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PATH": "/nonexistent", "GPU_FACT_PCI_DEVICES": str(tree)})
    assert json.loads(out.stdout)["models"] == ["NVIDIA 0x2bff"]


def test_the_fact_uses_gpuprovs_own_table() -> None:
    """gpu.fact runs on nodes without gpuprov: it carries a copy of the catalog's table."""
    tree = ast.parse(FACT.read_text())
    table = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODELS")
    assert table == catalog.GPU_BY_PCI_DEVICE
