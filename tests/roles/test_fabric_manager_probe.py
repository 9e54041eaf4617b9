"""The fabric manager probe (gpuprov/probes/test_stack.py) judges the node's own PCI bus
against the lock: it skips only where the lock has no fabric manager AND the bus has no
NVSwitch; NVSwitches without fabric manager in the lock, and a fabric-manager lock on a bus
without NVSwitch, fail naming both sides.

The probe's commands run on this machine with the sysfs PCI tree swapped for a recorded one
(tests/roles/fixtures/pci/README.md): the recorded H100 bus with its four added NVSwitch
functions, or the same bus as recorded (no NVSwitch).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuprov.lock import stack
from gpuprov.probes.conftest import Expectation
from gpuprov.probes.test_stack import test_fabric_manager_matches_driver as probe

NVSWITCH_BUS = Path(__file__).parent / "fixtures" / "pci" / "hgx-h100-nvswitch"
NVSWITCH_LOCK = stack.resolve("p4d.24xlarge", source="mirror", driver="535", kernel_module="proprietary").as_dict()
PLAIN_LOCK = stack.resolve(None).as_dict()


@dataclass
class _Result:
    rc: int
    stdout: str
    stderr: str


class FakeHost:
    """testinfra's ``host`` for the probe: its commands run here, formatted as testinfra does
    (each argument quoted), against ``pci`` instead of /sys/bus/pci/devices; the package
    database (the one ``dpkg-query`` the probe runs), systemd's answers and the unit's two
    states are the ones given."""

    def __init__(self, pci: Path, packages: dict[str, str], running: bool = True) -> None:
        self.pci, self.packages, self.running = pci, packages, running
        self.commands: list[str] = []

    def run(self, cmd: str, *args: str) -> _Result:
        line = cmd % tuple(shlex.quote(a) for a in args) if args else cmd
        self.commands.append(line)
        if line.startswith("dpkg-query -W -f '${db:Status-Status} ${Version}' "):
            version = self.packages.get(shlex.split(line)[-1])
            return _Result(0, f"installed {version}", "") if version else _Result(1, "", "no packages found")
        if line.startswith("test -d /run/systemd/system"):
            return _Result(0, "", "")  # a node run by systemd
        if line.startswith("systemctl is-active -- "):
            return _Result(0, ("active\nenabled\n0 0\n" if self.running else "inactive\nenabled\n3 0\n"), "")
        proc = subprocess.run(["sh", "-c", line.replace("/sys/bus/pci/devices", str(self.pci))],
                              capture_output=True, text=True, check=False)
        return _Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def plain_bus(tmp_path: Path) -> Path:
    """The recorded H100 bus without the added NVSwitch functions (10de:22a3)."""
    bus = tmp_path / "pci"
    shutil.copytree(NVSWITCH_BUS, bus)
    for dev in bus.iterdir():
        if (dev / "device").read_text().strip() == "0x22a3":
            shutil.rmtree(dev)
    return bus


def expect(lock: dict, nvswitch: bool | None = None) -> Expectation:
    return Expectation(node="n1", instance_type=lock["instance_type"], gpus=None, gpu_model=None,
                       nvswitch=nvswitch, virtualization="container", stack=lock)


class ProbeSkipped(Exception):
    """A skip where the probe must pass or fail (a bare skip would mark the test skipped)."""


def run_probe(host: FakeHost, lock: dict, may_skip: bool = False,
              nvswitch: bool | None = None) -> list[str]:
    reports: list[str] = []
    try:
        probe(host, expect(lock, nvswitch), reports.append)
    except pytest.skip.Exception as skipped:
        if may_skip:
            raise
        raise ProbeSkipped(str(skipped)) from None
    return reports


def test_skips_only_without_nvswitch_and_without_fabric_manager(plain_bus: Path) -> None:
    with pytest.raises(pytest.skip.Exception, match=r"^no NVSwitch on this node's PCI bus: no fabric manager$"):
        run_probe(FakeHost(plain_bus, {}), PLAIN_LOCK, may_skip=True)


def test_nvswitch_without_fabric_manager_in_the_lock_fails_naming_both() -> None:
    with pytest.raises(pytest.fail.Exception) as err:
        run_probe(FakeHost(NVSWITCH_BUS, {}), PLAIN_LOCK)
    text = str(err.value)
    assert "4 NVSwitch(es) on this node's PCI bus" in text
    assert "the lock (resolved for unknown) has no fabric manager" in text


def test_fabric_manager_lock_without_nvswitch_fails_naming_the_mismatch(plain_bus: Path) -> None:
    host = FakeHost(plain_bus, {"nvidia-fabricmanager-535": "535.309.01-1"})
    with pytest.raises(AssertionError) as err:
        run_probe(host, NVSWITCH_LOCK)
    text = str(err.value)
    assert "resolved for p4d.24xlarge) expects NVSwitch and fabric manager 535.309.01" in text
    assert "found no NVSwitch on this node's PCI bus" in text
    assert "has no NVSwitch" not in text


def test_mixed_cluster_node_declared_without_nvswitch_skips_only_if_its_bus_agrees(plain_bus: Path) -> None:
    # One lock for a mixed cluster carries fabric manager for its NVSwitch nodes.
    with pytest.raises(pytest.skip.Exception, match=r"^no NVSwitch on this node's PCI bus: no fabric manager$"):
        run_probe(FakeHost(plain_bus, {}), NVSWITCH_LOCK, may_skip=True, nvswitch=False)
    # Declared with NVSwitch (or not declared): the missing NVSwitch is a failure, not a skip.
    for declared in (True, None):
        with pytest.raises(AssertionError, match="found no NVSwitch on this node's PCI bus"):
            run_probe(FakeHost(plain_bus, {}), NVSWITCH_LOCK, nvswitch=declared)
    # Declared without NVSwitch but the bus has them: fabric manager is checked.
    with pytest.raises(AssertionError, match=r"expected nvidia-fabricmanager-535 535\.309\.01"):
        run_probe(FakeHost(NVSWITCH_BUS, {}), NVSWITCH_LOCK, nvswitch=False)


def test_nvswitch_with_matching_fabric_manager_passes() -> None:
    host = FakeHost(NVSWITCH_BUS, {"nvidia-fabricmanager-535": "535.309.01-1"})
    assert run_probe(host, NVSWITCH_LOCK) == [
        "nvidia-fabricmanager-535 535.309.01-1, enabled and running, 4 NVSwitch(es)"]
    # ... and a fabric manager at another release still fails, as before.
    with pytest.raises(AssertionError, match=r"found 535\.288\.01-1"):
        run_probe(FakeHost(NVSWITCH_BUS, {"nvidia-fabricmanager-535": "535.288.01-1"}), NVSWITCH_LOCK)


def test_a_stopped_fabric_manager_fails_naming_its_state() -> None:
    host = FakeHost(NVSWITCH_BUS, {"nvidia-fabricmanager-535": "535.309.01-1"}, running=False)
    with pytest.raises(AssertionError, match=r"expected nvidia-fabricmanager running \(4 NVSwitch\(es\) present\), "
                                             r"found nvidia-fabricmanager inactive, enabled"):
        run_probe(host, NVSWITCH_LOCK)
    assert host.commands[-1].startswith("systemctl is-active -- nvidia-fabricmanager;")
