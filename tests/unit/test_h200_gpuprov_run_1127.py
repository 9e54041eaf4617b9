"""gpuprov's own output on a real NVIDIA H200, recorded a second time on 2026-11-27
(tests/fixtures/recordings/h200-580/gpuprov-2026-11-27/README.md; the first run is
test_h200_gpuprov_run.py's): the JSON is the documented shape, the quick health level passes
there now that `peermem` skips where the machine has no RDMA adapter, and verify's rows say what
the machine lacks, with the Slurm probes skipping for a node without Slurm."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.json_doc import _normal, _paths, documented

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "h200-580" / "gpuprov-2026-11-27"
GPU_CHECKS = ("gpu_count", "gpu_answers", "driver", "ecc", "row_remap", "clocks", "temperature")


def recorded(name: str) -> tuple[dict[str, Any], int]:
    """A recording's JSON document (after stderr's progress lines) and its exit code."""
    lines = (HERE / name).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    end = max(i for i, line in enumerate(lines) if line.startswith("[exit "))
    return json.loads("\n".join(lines[start:end])), int(lines[end].removeprefix("[exit ").rstrip("]"))


@pytest.mark.parametrize(("command", "name"), [("health", "health-quick.json"), ("verify", "verify-local.json")])
def test_the_json_is_the_documented_shape(command: str, name: str) -> None:
    found = {_normal(p).replace(".vm", ".<>") for p in _paths(recorded(name)[0])}
    found = {p for p in found if not p.endswith(".<>")}  # a map key (the node's name) is a name
    assert found and found - set(documented()[command]) == set()


def test_the_quick_level_passes_on_the_h200_and_says_why_it_skips() -> None:
    data, code = recorded("health-quick.json")
    rows = {r["check"]: r for r in data["checks"]}
    assert code == 0 and data["ok"] is True
    assert all(rows[c]["status"] == "pass" for c in GPU_CHECKS), {c: rows[c]["status"] for c in GPU_CHECKS}
    assert "580.159.04" in rows["driver"]["found"] and "NVIDIA H200" in rows["gpu_answers"]["found"]
    skipped = {c: r["reason"] for c, r in rows.items() if r["status"] == "skip"}
    assert set(skipped) == {"fabricmanager", "nvlink", "xid", "efa", "peermem"}
    assert all(skipped.values()), skipped  # each skip with its reason
    assert "no InfiniBand/RoCE device" in skipped["peermem"]
    assert "580.159.04, NVIDIA H200, 0x233510DE" in (HERE / "machine.txt").read_text()


def test_verify_passes_what_reads_the_gpu_and_names_what_the_machine_lacks() -> None:
    data, code = recorded("verify-local.json")
    rows = data["hosts"]["vm"]
    assert code == 1 and data["ok"] is False
    status = {r["probe"]: r["status"] for r in rows}
    assert Counter(status.values()) == {"pass": 8, "fail": 33, "skip": 12}
    assert {p for p, s in status.items() if s == "pass"} >= {
        "gpus_on_pci_bus", "nvidia_smi_sees_gpus", "driver_version_persistence_and_model",
        "cuda_context_can_be_created", "running_kernel_module_flavour_matches_the_lock"}
    details = {r["probe"]: r["detail"] for r in rows}
    # The machine's own CUDA 13.0 and NCCL 2.28.3, not the lock's 11.8 and 2.16.5.
    assert "found 13.0" in details["nvcc_reports_the_locked_cuda"]
    assert "2.28.3-1+cuda13.0" in details["nccl_matches_the_lock"]
    slurm = [p for p, s in status.items() if s == "skip" and "no Slurm on this node" in details[p]]
    assert len(slurm) == 9, slurm
    assert all(details[p] for p, s in status.items() if s != "pass")  # no failure or skip without words


def test_the_standard_level_names_the_missing_tools() -> None:
    text = (HERE / "health-standard.txt").read_text()
    assert "FAIL dcgm_diag: dcgmi is not installed" in text
    assert "FAIL nccl_allreduce_node: all_reduce_perf (NVIDIA nccl-tests) is not installed" in text
    assert text.rstrip().endswith("[exit 1]")


def test_the_cuda_13_line_is_proven_on_the_h200_and_its_libraries_named_by_version() -> None:
    """`verify --local --cuda 13.0`: nvcc 13.0 compiles for the H200's sm_90 and the program runs;
    cuDNN and NCCL fail by version, with what the machine's packages hold (cuda-packages.txt)."""
    data, code = recorded("verify-local-cuda13.json")
    rows = {r["probe"]: r for r in data["hosts"]["vm"]}
    assert code == 1 and "CUDA 13.0" in (HERE / "verify-local-cuda13.txt").read_text().splitlines()[2]
    assert rows["nvcc_reports_the_locked_cuda"]["status"] == "pass"
    assert "release 13.0" in rows["nvcc_reports_the_locked_cuda"]["detail"]
    compiled = rows["nvcc_compiles_for_the_locked_architectures"]
    assert compiled["status"] == "pass" and "sm_90" in compiled["detail"] and "13000" in compiled["detail"]
    packages = (HERE / "cuda-packages.txt").read_text()
    assert "libcudnn9-headers-cuda-13\t9.14.0.64-1" in packages and "libnccl2\t2.28.3-1+cuda13.0" in packages
    assert rows["cudnn_matches_the_lock"]["detail"] == "expected cudnn_version.h to say 9.17.1, found 9.14.0"
    assert "2.28.3-1+cuda13.0" in rows["nccl_matches_the_lock"]["detail"]
    # The run before the probe read cuDNN 9's header name found none on the same machine.
    assert "expected cudnn_version.h to say 9.17.1, found None" in (HERE / "verify-local-cuda13-first.txt").read_text()
