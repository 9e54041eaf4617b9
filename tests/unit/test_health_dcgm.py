"""gpuprov health's standard level: DCGM's diagnostic table (gpuprov.health.dcgm) and the
checks that read it and NCCL inside the node (gpuprov.health.checks_deep), on published
`dcgmi diag` runs of real machines and on the real H100's nccl-tests run
(tests/fixtures/recordings/dcgm-published/README.md, h100-sxm5-580/README.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuprov.health import STANDARD, evaluate, gather
from gpuprov.health import dcgm as diag
from gpuprov.health.checks_deep import dcgm_diag, nccl_in_node
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section, recorded

REC = Path(__file__).parents[1] / "fixtures" / "recordings"
DCGM = REC / "dcgm-published"
H100 = REC / "h100-sxm5-580"


def text(path: Path) -> str:
    return recorded(path.read_text())


def pci_of(path: Path) -> str:
    """The gather script's pci section from a recorded sysfs listing (NVIDIA functions only)."""
    return "\n".join(line for line in text(path).splitlines() if "vendor=0x10de" in line)


# -- the parser -------------------------------------------------------------------------------------
def test_a_passing_p4de_level_2_run_reads_as_its_tests_and_metadata() -> None:
    report = diag.parse(text(DCGM / "p4de-24xlarge-diag-r2.txt"))
    assert report.ran and report.failures == []
    assert report.metadata == {"DCGM Version": "3.3.3", "Driver Version Detected": "535.104.12",
                               "GPU Device IDs Detected": ",".join(["20b2"] * 8)}
    assert [(t.category, t.name) for t in report.tests][-2:] == [("Integration", "PCIe"), ("Hardware", "GPU Memory")]
    assert report.tests[-1].results == [("pass", "All")]
    assert len(report.tests) == 11


def test_a_failed_stress_test_keeps_its_gpus_and_its_wrapped_message_whole() -> None:
    report = diag.parse(text(DCGM / "g5-12xlarge-diag-r3-targeted-power-fail.txt"))
    (power,) = report.failures
    assert (power.category, power.name) == ("Stress", "Targeted Power")
    assert power.results == [("pass", "GPUs: 0, 2, 3"), ("fail", "GPU: 1")]
    # dcgmi wrapped "desired" and "224.2" mid-word; joined, the words are whole again.
    assert power.warnings[0] == (
        "GPU 1 Max power of 224.1 did not reach desired power minimum target_power_min_ratio of 224.2 for "
        "GPU 1 Verify that the clock speeds and GPU utilization are high.")
    assert power.info[0] == "GPU 0 GPU 0 max power: 299.5 W average power usage: 299.0 W"
    eud = next(t for t in report.tests if t.name == "EUD Test")
    assert eud.results == [("skip", "All")]


def test_dcgm_4_per_gpu_rows_and_dcgm_2_tables_without_metadata_are_read() -> None:
    four = diag.parse(text(DCGM / "a10g-dcgm4-diag-r2.txt"))
    assert [(t.name, t.results) for t in four.tests] == [
        ("software", [("pass", ""), ("pass", "GPU 0")]), ("memory", [("pass", ""), ("pass", "GPU 0")]),
        ("pcie", [("pass", ""), ("pass", "GPU 0")])]
    two = diag.parse(text(DCGM / "dcgm2-diag-r4.txt"))
    assert two.ran and two.metadata == {} and two.failures == []
    assert {t.category for t in two.tests} == {"Deployment", "Integration", "Hardware", "Stress"}
    # A test named "Diagnostic" (Hardware) is a test, not the table's header.
    assert ("Hardware", "Diagnostic") in [(t.category, t.name) for t in two.tests]


def test_a_published_fragment_is_not_taken_for_a_complete_run() -> None:
    report = diag.parse(text(DCGM / "gpu-memory-thermal-fail-fragment.txt"))
    assert not report.ran


# -- the verdict ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "status", "found"), [
    ("p4de-24xlarge-diag-r2.txt", "pass", "dcgmi diag -r 2: 11 test(s), DCGM 3.3.3, none failed"),
    ("a10g-dcgm4-diag-r2.txt", "pass", "dcgmi diag -r 2: 3 test(s), DCGM 4.4.2, none failed"),
    ("g5-12xlarge-diag-r3-targeted-power-fail.txt", "fail",
     "dcgmi diag -r 2: Stress/Targeted Power failed (GPU: 1): GPU 1 Max power of 224.1 did not reach desired"),
    ("p4de-24xlarge-diag-r2-edited-gpu-memory-thermal.txt", "fail",
     "dcgmi diag -r 2: Hardware/GPU Memory failed (GPU: 0): GPU 0 Thermal violations totaling 13.3 seconds "
     "started at 9.7 seconds"),
])
def test_each_recorded_run_gets_its_verdict(name: str, status: str, found: str) -> None:
    row = diag.diag_check("n1", text(DCGM / name), 0, level=2, expected="every test passes")
    assert (row.node, row.check, row.status) == ("n1", "dcgm_diag", status)
    assert row.found.startswith(found), row.found
    assert bool(row.action) == (status == "fail")


def test_a_skipped_test_passes_and_is_named() -> None:
    two = text(DCGM / "dcgm2-diag-r4.txt").replace("| Memtest                   | Pass - All ",
                                                    "| Memtest                   | Skip - All ")
    row = diag.diag_check("n1", two, 0, level=2, expected="")
    assert row.status == "pass" and row.found.endswith("skipped: Memtest"), row.found


def test_the_failed_category_picks_the_action() -> None:
    power = diag.diag_check("n", text(DCGM / "g5-12xlarge-diag-r3-targeted-power-fail.txt"), 0, level=3, expected="")
    memory = diag.diag_check("n", text(DCGM / "p4de-24xlarge-diag-r2-edited-gpu-memory-thermal.txt"), 0, level=2,
                             expected="")
    assert power.action == diag.ACTIONS["stress"] and memory.action == diag.ACTIONS["hardware"]


@pytest.mark.parametrize(("out", "rc", "found", "action"), [
    ("dcgmi: not found", 127, "dcgmi is not installed", "install NVIDIA DCGM"),
    ("", 124, "dcgmi diag -r 2 did not finish in its time budget", "drain the node"),
    # Written here, not recorded (no published output of it was found): an error line and no table.
    ("Error: Unable to connect to host engine.", 255,
     "dcgmi diag -r 2: Error: Unable to connect to host engine.", "start the DCGM host engine"),
    (text(DCGM / "gpu-memory-thermal-fail-fragment.txt"), 0, "dcgmi diag -r 2:", "read the raw output"),
])
def test_a_diagnostic_that_did_not_run_fails_saying_why(out: str, rc: int, found: str, action: str) -> None:
    row = diag.diag_check("n", out, rc, level=2, expected="")
    assert row.status == "fail" and row.found.startswith(found) and row.action.startswith(action), row


# -- the checks on a node's readings ----------------------------------------------------------------
def facts(**sections: tuple[str, int | None]) -> Facts:
    return Facts({k: Section(v, rc) for k, (v, rc) in sections.items()})


P4DE_BUS = "\n".join(f"/sys/bus/pci/devices/0000:{b}:00.0 vendor=0x10de device=0x20b2 class=0x030200"
                     for b in ("10", "20", "90", "a0", "b0", "c0", "d0", "e0"))


def test_dcgm_diag_on_a_p4de_reading_passes_and_asks_for_its_12_links() -> None:
    row = dcgm_diag(facts(pci=(P4DE_BUS, 0), dcgm_diag=(text(DCGM / "p4de-24xlarge-diag-r2.txt"), 0)),
                    Expect(instance_type="p4de.24xlarge", gpus=8))
    assert row.status == "pass"
    assert "12 NVLink links up per GPU" in row.expected and "within 600 s" in row.expected


def test_nccl_in_node_passes_the_real_h100_run_and_says_it_is_judged_on_wrong_results() -> None:
    f = facts(pci=(pci_of(H100 / "pci.txt"), 0), nccl_tests=(text(H100 / "nccl-tests.txt"), 0))
    row = nccl_in_node(f, Expect(gpus=1))
    assert row.check == "nccl_allreduce_node" and row.status == "pass", row
    assert "wrong results only" in row.expected


def test_nccl_in_node_fails_a_wrong_sum_and_a_missing_tool() -> None:
    real = text(H100 / "nccl-tests.txt")
    lines = real.splitlines()
    # Edited in memory: the last size row of all_reduce_perf with 1 wrong result out of place.
    i = max(n for n, line in enumerate(lines) if line.strip().startswith("1073741824"))
    cols = lines[i].split()
    cols[8] = "1"
    lines[i] = "  " + "  ".join(cols)
    bus = (pci_of(H100 / "pci.txt"), 0)
    wrong = nccl_in_node(facts(pci=bus, nccl_tests=("\n".join(lines), 0)), Expect(gpus=1))
    assert wrong.status == "fail" and "wrong result" in wrong.found, wrong
    missing = nccl_in_node(facts(pci=bus, nccl_tests=("all_reduce_perf: not found", 127)), Expect(gpus=1))
    assert missing.status == "fail" and "not installed" in missing.found


def test_on_a_node_without_gpu_both_checks_skip_with_the_reason() -> None:
    f = facts(container=("docker", 0), pci=("", 0), dcgm_diag=("no NVIDIA device on the PCI bus", 0),
              nccl_tests=("no NVIDIA device on the PCI bus", 0))
    rows = [dcgm_diag(f, Expect(gpus=0, instance_type="docker-node")), nccl_in_node(f, Expect())]
    assert [r.status for r in rows] == ["skip", "skip"]
    assert rows[0].reason == "container node: docker-node has no GPU (catalog: 0 GPUs)"
    assert rows[1].reason == "container node: no NVIDIA GPU on the PCI bus"


# -- the script ------------------------------------------------------------------------------------
def test_the_standard_script_adds_its_sections_and_the_catalog_link_count_only() -> None:
    quick, standard = gather.script(), gather.script("standard", 18)
    assert "dcgmi" not in quick and "all_reduce_perf" not in quick
    assert "dcgmi diag -r 2 -p pcie.gpu_nvlinks_expected_up=18 2>&1" in standard
    assert "@NVLINKS@" not in gather.script("standard", None)
    with pytest.raises(ValueError):
        gather.script("standard", "12; reboot")  # type: ignore[arg-type]


def test_the_standard_script_runs_here_and_skips_its_tools_without_a_gpu() -> None:
    proc = subprocess.run(["sh", "-s"], input=gather.script("standard"), capture_output=True, text=True,
                          timeout=120, check=False)
    found = gather.split(proc.stdout)
    assert list(found) == [*gather.COMMANDS, *gather.STANDARD]
    rows = {r.check: r for r in evaluate("here", Facts(found), Expect(), "standard")}
    assert len(rows) == len(STANDARD)
    if not Facts(found).gpus_on_bus:  # this machine: no NVIDIA device
        assert found["dcgm_diag"].text == "no NVIDIA device on the PCI bus"
        assert rows["dcgm_diag"].status == rows["nccl_allreduce_node"].status == "skip"
