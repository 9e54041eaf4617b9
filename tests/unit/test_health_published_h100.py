"""gpuprov health's quick GPU checks on a published `nvidia-smi -q` of an 8 x H100 node on
driver 535 (tests/fixtures/recordings/h100-8gpu-535-published/README.md): the healthy GPUs
pass, and the power brake one GPU really shows fails `clocks`, unedited."""

from __future__ import annotations

from pathlib import Path

from gpuprov.health import checks_state
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section

REC = Path(__file__).parents[1] / "fixtures" / "recordings" / "h100-8gpu-535-published" / "nvidia-smi-q-gpus-53-64-75.txt"
BUSES = ("53", "64", "75")


def facts() -> Facts:
    bus = "\n".join(f"/sys/bus/pci/devices/0000:{b}:00.0 vendor=0x10de device=0x2330 class=0x030200" for b in BUSES)
    return Facts({"smi_q": Section(REC.read_text(), 0), "pci": Section(bus, 0), "uid": Section("0", 0)})


def test_the_three_gpus_are_read_from_a_full_report() -> None:
    assert sorted(facts().q) == [f"00000000:{b}:00.0" for b in BUSES]


def test_ecc_row_remap_and_temperature_pass_on_the_real_report() -> None:
    f, want = facts(), Expect(gpus=3, instance_type="p5.48xlarge")
    ecc, remap, temp = (c(f, want) for c in (checks_state.ecc, checks_state.row_remap, checks_state.temperature))
    assert (ecc.status, ecc.found) == ("pass", "0 uncorrectable volatile ECC errors on 3 GPU(s)")
    assert (remap.status, remap.found) == ("pass", "no pending remap, no failure on 3 GPU(s)")
    # Driver 535's relative form: slowdown = 39 + 47 - (-2) = 88 °C on GPU 75.
    assert temp.status == "pass" and temp.found == "hottest GPU 39 °C" and "(88 °C)" in temp.expected, temp


def test_the_real_power_brake_fails_clocks_with_the_power_action() -> None:
    row = checks_state.clocks(facts(), Expect(gpus=3))
    assert row.status == "fail"
    assert row.found == "00000000:75:00.0: HW Power Brake Slowdown"
    assert row.action.startswith("drain the node and check its power supplies")
