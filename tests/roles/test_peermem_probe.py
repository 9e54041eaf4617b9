"""The nvidia-peermem probe (gpuprov/probes/test_rdma.py) judges GPUDirect RDMA only where it can
exist: on a machine (not a container) with an InfiniBand/RoCE adapter it wants nvidia-peermem
loaded at boot and loaded; with none, as on the real H200 VM of tests/fixtures/recordings/h200-580,
it skips saying so, as `gpuprov health`'s peermem check does (it failed there before).

The probe's commands run on this machine with the node's paths swapped for a tree of the test's
own (FIXTURE, this machine has no GPU and no RDMA adapter): /sys/bus/pci/devices for the recorded
H100 bus (tests/roles/fixtures/pci/README.md), /sys/class/infiniband for adapters made here
(a device whose device/driver links to its kernel driver, as sysfs has it), /etc/modules-load.d
for a directory of the test's; the node answers "none" to systemd-detect-virt (a VM or metal).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprov.probes.conftest import Expectation
from gpuprov.probes.test_rdma import test_nvidia_peermem_configured as probe

BUS = Path(__file__).parent / "fixtures" / "pci" / "hgx-h100-nvswitch"


@dataclass
class _Result:
    rc: int
    stdout: str
    stderr: str


@dataclass
class _File:
    exists: bool


class MachineHost:
    """testinfra's ``host`` for a VM or metal machine whose sysfs and /etc are ``root``'s."""

    def __init__(self, root: Path, loaded: bool) -> None:
        self.root, self.loaded = root, loaded

    def run(self, cmd: str) -> _Result:
        cmd = (cmd.replace("systemd-detect-virt --container", "(echo none; false)")
               .replace("/sys/bus/pci/devices", str(BUS))
               .replace("/sys/class/infiniband", str(self.root / "infiniband"))
               .replace("/etc/modules-load.d", str(self.root / "modules-load.d")))
        proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=False)
        return _Result(proc.returncode, proc.stdout, proc.stderr)

    def file(self, path: str) -> _File:
        return _File(path == "/sys/module/nvidia_peermem" and self.loaded)


def machine(tmp_path: Path, adapters: dict[str, str], conf: bool, loaded: bool) -> MachineHost:
    for sub in ("infiniband", "modules-load.d", "drivers"):
        (tmp_path / sub).mkdir()
    for device, driver in adapters.items():
        (tmp_path / "drivers" / driver).mkdir(exist_ok=True)
        (tmp_path / "infiniband" / device / "device").mkdir(parents=True)
        (tmp_path / "infiniband" / device / "device" / "driver").symlink_to(tmp_path / "drivers" / driver)
    if conf:
        (tmp_path / "modules-load.d" / "gpuprov-nvidia-peermem.conf").write_text("# gpuprov\nnvidia-peermem\n")
    return MachineHost(tmp_path, loaded)


def judge(host: MachineHost) -> tuple[str, str]:
    expect = Expectation(node="n1", instance_type=None, gpus=1, gpu_model=None, nvswitch=None,
                         virtualization="vm", stack=None)
    reports: list[str] = []
    try:
        probe(host, expect, reports.append)
    except pytest.skip.Exception as skipped:
        return "skip", str(skipped)
    except AssertionError as failed:
        return "fail", str(failed)
    return "pass", reports[-1]


def test_a_machine_without_an_rdma_adapter_skips_with_the_reason(tmp_path: Path) -> None:
    assert judge(machine(tmp_path, {}, conf=False, loaded=False)) == (
        "skip", "no InfiniBand/RoCE device in /sys/class/infiniband: GPUDirect RDMA has no adapter here")


def test_efa_is_no_infiniband_adapter_for_peermem(tmp_path: Path) -> None:
    status, why = judge(machine(tmp_path, {"rdmap16s27": "efa"}, conf=False, loaded=False))
    assert status == "skip" and "no InfiniBand/RoCE device" in why


@pytest.mark.parametrize(("conf", "loaded", "want"), [
    (False, False, ("fail", "expected nvidia-peermem in /etc/modules-load.d, found it absent")),
    (True, False, ("fail", "expected nvidia_peermem loaded, it is not")),
    (True, True, ("pass", "nvidia-peermem loads at boot and is loaded")),
])
def test_a_machine_with_an_infiniband_adapter_is_judged(tmp_path: Path, conf: bool, loaded: bool,
                                                         want: tuple[str, str]) -> None:
    status, detail = judge(machine(tmp_path, {"mlx5_0": "mlx5_core"}, conf=conf, loaded=loaded))
    assert (status, detail.splitlines()[0]) == want
