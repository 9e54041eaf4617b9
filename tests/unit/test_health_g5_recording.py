"""gpuprov health's GPU state checks on a whole `nvidia-smi -q` of a real EC2 g5 node (one
NVIDIA A10G, driver 535.247.01), published in NVIDIA/DCGM issue 232
(tests/fixtures/recordings/g5-xlarge/README.md), and on copies of it that each carry one
fault. Each edit is made here, in memory, and named by its test id: one line of the report
changed to the form nvidia-smi prints for that fault, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import catalog
from gpuprov.health import checks_state, parse
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section

REPORT = (Path(__file__).parents[1] / "fixtures" / "recordings" / "g5-xlarge" / "nvidia-smi-q.txt").read_text()
BUS = "00000000:00:1E.0"
CHECKS = {"ecc": checks_state.ecc, "row_remap": checks_state.row_remap, "clocks": checks_state.clocks,
          "temperature": checks_state.temperature}


def facts(report: str) -> Facts:
    # The GPU's PCI function as gpuprov's census prints it, from the report's own PCI section
    # (Bus Id 00000000:00:1E.0, Device Id 0x223710DE: device 0x2237 of vendor 0x10de).
    pci = "/sys/bus/pci/devices/0000:00:1e.0 vendor=0x10de device=0x2237 class=0x030200"
    return Facts({"smi_q": Section(report, 0), "pci": Section(pci, 0), "uid": Section("0", 0)})


def edited(old: str, new: str) -> str:
    assert REPORT.count(old) == 1, old  # the edit touches exactly the line it names
    return REPORT.replace(old, new)


def test_the_report_is_the_one_a10g_the_catalog_gives_a_g5() -> None:
    q = facts(REPORT).q
    g5 = catalog.get("g5.xlarge")
    assert list(q) == [BUS] and len(q) == g5.gpu_count
    assert parse.at(q[BUS], "Product Name") == f"NVIDIA {g5.gpu_model}"
    device = parse.at(q[BUS], "PCI", "Device Id")  # 0x<device><vendor>
    assert device == "0x223710DE" and catalog.GPU_BY_PCI_DEVICE["0x" + device[2:6].lower()] == g5.gpu_model


def test_every_state_check_passes_on_the_real_report() -> None:
    rows = {name: check(facts(REPORT), Expect(gpus=1, instance_type="g5.xlarge")) for name, check in CHECKS.items()}
    assert {name: row.status for name, row in rows.items()} == dict.fromkeys(CHECKS, "pass")
    # The real report carries one aggregate correctable DRAM error: history, not a fault.
    assert parse.at(facts(REPORT).q[BUS], "ECC Errors", "Aggregate", "DRAM Correctable") == "1"
    assert rows["ecc"].found == "0 uncorrectable volatile ECC errors on 1 GPU(s)"
    # Driver 535 prints the A10G's absolute thresholds: slowdown 95 °C.
    assert rows["temperature"].found == "hottest GPU 27 °C" and "(95 °C)" in rows["temperature"].expected


FAULTS = {
    "uncorrectable-ecc": ("ecc", "            DRAM Uncorrectable            : 0\n        Aggregate",
                          "            DRAM Uncorrectable            : 1\n        Aggregate",
                          f"{BUS}: 1 uncorrectable volatile ECC error(s)"),
    "ecc-disabled": ("ecc", "    ECC Mode\n        Current                           : Enabled",
                     "    ECC Mode\n        Current                           : Disabled", None),
    "remap-pending": ("row_remap", "        Pending                           : No\n        Remapping",
                      "        Pending                           : Yes\n        Remapping", f"{BUS}: Pending: Yes"),
    "remap-failure": ("row_remap", "        Remapping Failure Occurred        : No",
                      "        Remapping Failure Occurred        : Yes", None),
    "hw-thermal-slowdown": ("clocks",
                            "        HW Slowdown                       : Not Active\n"
                            "            HW Thermal Slowdown           : Not Active",
                            "        HW Slowdown                       : Active\n"
                            "            HW Thermal Slowdown           : Active",
                            f"{BUS}: HW Slowdown, HW Thermal Slowdown"),
    "hot": ("temperature", "GPU Current Temp                  : 27 C", "GPU Current Temp                  : 86 C",
            None),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_edited_copy_fails_exactly_its_check(fault: str) -> None:
    failing, old, new, found = FAULTS[fault]
    report = edited(old, new)
    rows = {name: check(facts(report), Expect(gpus=1, instance_type="g5.xlarge")) for name, check in CHECKS.items()}
    assert {name for name, row in rows.items() if row.status != "pass"} == {failing}
    row = rows[failing]
    assert row.status == "fail" and row.action, row
    assert BUS in row.found, row
    if found is not None:
        assert row.found == found
