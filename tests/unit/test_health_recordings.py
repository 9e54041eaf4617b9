"""gpuprov health's verdicts on recordings of real machines (tests/fixtures/recordings/):
every check passes (or skips, with its reason) on the healthy H100 and H200, and each check
fails, with the right action, on a copy of a recording edited to show one fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuprov.health import evaluate
from gpuprov.health.checks_gpu import ALERT_C
from gpuprov.health.checks_state import Temperatures, temperature, thresholds
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section
from tests.fixtures.health_recordings import EDITED, LOCK, REC, body, sections


def verdicts(machine: str, model: str, swap: dict[str, Path] | None = None) -> dict[str, Any]:
    expect = Expect(gpus=1, gpu_model=model, lock=LOCK)
    return {c.check: c for c in evaluate("n1", Facts(sections(machine, swap or {})), expect)}


@pytest.mark.parametrize(("machine", "model"), [("h100-sxm5-580", "H100"), ("h200-580", "H200")])
def test_every_check_passes_or_skips_with_a_reason_on_a_healthy_machine(machine: str, model: str) -> None:
    found = verdicts(machine, model)
    assert {k for k, c in found.items() if c.status == "fail"} == set(), [c for c in found.values()]
    skipped = {k: c.reason for k, c in found.items() if c.status == "skip"}
    # One GPU in a VM: no NVSwitch, no NVLink peer, an untyped host has no EFA, and no
    # InfiniBand/RoCE adapter for nvidia-peermem to serve.
    assert set(skipped) == {"fabricmanager", "nvlink", "efa", "peermem"}
    assert "no InfiniBand/RoCE device" in skipped["peermem"]
    assert all(skipped.values())
    assert found["gpu_answers"].found == f"1 GPU(s) answer: NVIDIA {model}" + (" 80GB HBM3" if model == "H100" else "")
    assert found["driver"].found == "kernel module 580.159.04, nvidia-smi agrees"


def test_the_real_temperature_report_gives_nvmls_thresholds() -> None:
    """Driver 580 prints margins, not thresholds; NVML on the same machines says shutdown 95,
    slowdown 89 and GPU max operating 87 °C (nvml.txt)."""
    from gpuprov.health import parse

    for machine, current in (("h100-sxm5-580", 33), ("h200-580", 40)):
        tree = parse.smi_q(body(REC / machine / "q-TEMPERATURE.txt"))["00000000:00:06.0"]
        assert thresholds(tree) == Temperatures(current, shutdown=95, slowdown=89, max_operating=87, form="relative")
        nvml = (REC / machine / "nvml.txt").read_text()
        for line in ("threshold shutdown: 95", "threshold slowdown: 89", "threshold gpu max: 87"):
            assert line in nvml
    assert ALERT_C == 85


# An older driver's report (525.105.17, an H800: published, see the recordings README).
H800 = REC / "h800-525-published" / "nvidia-smi-q-i0.txt"


def test_an_older_driver_prints_absolute_thresholds_read_as_printed() -> None:
    from gpuprov.health import parse

    tree = parse.smi_q(body(H800))["00000000:18:00.0"]
    found = thresholds(tree)
    assert found == Temperatures(35, shutdown=92, slowdown=89, max_operating=87, form="absolute")
    # Its T.Limit line stands beside the thresholds but does not add up to them (35 + 51 is
    # 86, not 87): the margin form is used only where no threshold is printed.
    assert tree["Temperature"]["GPU T.Limit Temp"] == "51 C"
    assert found.limits() == "max operating 87 °C, slowdown 89 °C, shutdown 92 °C"


def test_a_report_without_thresholds_gives_the_reading_only() -> None:
    from gpuprov.health import parse

    text = body(H800)
    for line in ("GPU Shutdown Temp", "GPU Slowdown Temp", "GPU Max Operating Temp", "GPU T.Limit Temp"):
        text = "\n".join(x for x in text.splitlines() if line not in x)
    assert thresholds(parse.smi_q(text)["00000000:18:00.0"]) == Temperatures(35)


def _h800_temperature(current: int | None = None) -> Any:
    """The temperature check on the H800 report; ``current``: its `GPU Current Temp` edited
    here, in memory, from 35 C (the only change)."""
    text = body(H800)
    if current is not None:
        old = "GPU Current Temp                  : 35 C"
        assert old in text
        text = text.replace(old, f"GPU Current Temp                  : {current} C")
    return temperature(Facts({"smi_q": Section(text, 0)}), Expect(gpus=1, gpu_model="H100", lock=LOCK))


def test_the_temperature_check_on_an_older_drivers_report() -> None:
    ok = _h800_temperature()
    assert (ok.status, ok.found) == ("pass", "hottest GPU 35 °C")
    assert ok.expected == "below 85 °C and below the GPU's slowdown (89 °C)"
    hot = _h800_temperature(86)
    assert hot.status == "fail"
    assert hot.found == ("00000000:18:00.0: 86 °C (limit 85 °C); the GPU's own max operating 87 °C, "
                         "slowdown 89 °C, shutdown 92 °C"), hot.found


@pytest.mark.parametrize(("check", "swap", "found", "action"), EDITED, ids=lambda v: str(v)[:40])
def test_each_check_fails_on_its_edited_recording_with_the_right_action(check, swap, found, action) -> None:
    healthy = verdicts("h100-sxm5-580", "H100")
    edited = verdicts("h100-sxm5-580", "H100", {k: REC / v for k, v in swap.items()})
    assert healthy[check].status == "pass"
    row = edited[check]
    assert row.status == "fail", row
    assert found in row.found and action in row.action, row
    # One fault shows as one failed check (a GPU gone also leaves nothing to answer for).
    failing = {k for k, c in edited.items() if c.status == "fail"}
    assert failing == {check} or (check == "gpu_count" and failing <= {"gpu_count", "gpu_answers"})


def test_a_contained_ecc_xid_is_watched_not_failed() -> None:
    row = verdicts("h100-sxm5-580", "H100", {"kernel_log": REC / "h100-sxm5-580-edited-xid/dmesg-xid94.txt"})["xid"]
    assert row.status == "pass" and "Xid 94 on 0000:00:06 x1 (contained ECC error: watch)" in row.found


def test_nvlink_counts_links_against_the_catalog_on_a_published_output() -> None:
    folder = REC / "a100-sxm4-edited-nvlink-inactive"
    expect = Expect(instance_type="p4d.24xlarge", gpus=2, gpu_model="A100", nvswitch=True, lock=LOCK)
    assert expect.nvlink_per_gpu == 12
    from gpuprov.health.checks_gpu import nvlink

    good = nvlink(Facts({"nvlink": Section(body(folder / "nvlink-s-published.txt"), 0)}), expect)
    assert good.status == "pass" and good.found == "24 links up on 2 GPU(s)"
    bad = nvlink(Facts({"nvlink": Section(body(folder / "nvlink-s.txt"), 0)}), expect)
    assert bad.status == "fail" and "GPU 1: 11 up, links 3 inactive" in bad.found
    assert "reset the GPUs" in bad.action
    p5 = Expect(instance_type="p5.48xlarge", gpus=2, gpu_model="H100", nvswitch=True, lock=LOCK)
    short = nvlink(Facts({"nvlink": Section(body(folder / "nvlink-s-published.txt"), 0)}), p5)
    assert short.status == "fail" and "GPU 0: 12 up" in short.found and short.expected.startswith("18 NVLink")
