"""gpuprov's own output on a real NVIDIA H200 (recorded 2026-11-26, `gpuprov verify --local` and
`gpuprov health --local` run there as root over the local connection; see
tests/fixtures/recordings/h200-580/gpuprov-2026-11-26/README.md): the JSON is the documented
shape, every GPU check read the real GPU and passed, and what failed there failed for a
reason the machine shows (it was never provisioned by gpuprov)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.json_doc import _normal, _paths, documented

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "h200-580" / "gpuprov-2026-11-26"
GPU_CHECKS = ("gpu_count", "gpu_answers", "driver", "ecc", "row_remap", "clocks", "temperature")


def recorded_json(name: str) -> dict[str, Any]:
    """The JSON document of a recording (stderr's progress lines come first, `[exit N]` last)."""
    lines = (HERE / name).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    end = max(i for i, line in enumerate(lines) if line.startswith("[exit "))
    return json.loads("\n".join(lines[start:end]))


def exit_code(name: str) -> int:
    return int((HERE / name).read_text().rsplit("[exit ", 1)[1].split("]")[0])


@pytest.mark.parametrize(("command", "name"), [("health", "health-quick.json"), ("verify", "verify-local.json")])
def test_the_json_printed_on_the_h200_is_the_documented_shape(command: str, name: str) -> None:
    found = {_normal(p).replace(".vm", ".<>") for p in _paths(recorded_json(name))}
    # A map key (the node's name) is a name, not a field.
    found = {p for p in found if not p.endswith(".<>")}
    assert found and found - set(documented()[command]) == set()


def test_every_gpu_check_read_the_real_h200_and_passed() -> None:
    rows = {r["check"]: r for r in recorded_json("health-quick.json")["checks"]}
    for check in GPU_CHECKS:
        assert rows[check]["status"] == "pass", rows[check]
    assert "H200" in rows["gpu_count"]["found"] and "NVIDIA H200" in rows["gpu_answers"]["found"]
    assert "580.159.04" in rows["driver"]["found"]
    # The slowdown point is the one NVML gives this GPU (89 °C), not a table's.
    assert "89 °C" in rows["temperature"]["expected"]
    # One GPU has no NVLink peer: a skip with its reason, never a pass.
    assert rows["nvlink"]["status"] == "skip" and "one GPU" in rows["nvlink"]["reason"]


def test_what_failed_there_failed_for_what_the_machine_lacks() -> None:
    data = recorded_json("health-quick.json")
    failed = {r["check"]: r for r in data["checks"] if r["status"] == "fail"}
    assert set(failed) == {"peermem"} and "loaded: no" in failed["peermem"]["found"]
    assert data["ok"] is False and exit_code("health-quick.json") == 1
    verify = recorded_json("verify-local.json")["hosts"]["vm"]
    passed = {r["probe"] for r in verify if r["status"] == "pass"}
    assert {"gpus_on_pci_bus", "nvidia_smi_sees_gpus", "driver_version_persistence_and_model",
            "cuda_context_can_be_created", "running_kernel_module_flavour_matches_the_lock"} <= passed
    # No Docker and no driver packages there (the driver is mounted): those probes say so.
    details = {r["probe"]: r["detail"] for r in verify}
    assert "docker: not found" in details["docker_run_gpus_all_sees_the_gpus"]
    assert "found 13.0" in details["nvcc_reports_the_locked_cuda"]


def test_the_standard_level_names_the_missing_tools_instead_of_skipping() -> None:
    text = (HERE / "health-standard.txt").read_text()
    assert "FAIL dcgm_diag: dcgmi is not installed" in text
    assert "FAIL nccl_allreduce_node: all_reduce_perf (NVIDIA nccl-tests) is not installed" in text


def test_the_junit_report_counts_what_the_json_counts() -> None:
    text = (HERE / "health-quick-junit.xml").read_text()
    xml = text[text.index("<?xml"):text.rindex("[exit ")] if "<?xml" in text else \
        text[text.index("<testsuite"):text.rindex("[exit ")]
    root = ET.fromstring(xml.strip())
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    checks = recorded_json("health-quick.json")["checks"]
    assert int(suite.get("tests")) == len(checks)
    assert int(suite.get("failures")) == sum(r["status"] == "fail" for r in checks)
    assert int(suite.get("skipped")) == sum(r["status"] == "skip" for r in checks)
