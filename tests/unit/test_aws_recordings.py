"""gpuprov's parsers, health checks and probes on public recordings of real EC2 GPU instances
(tests/fixtures/recordings/p4d-24xlarge, p5-48xlarge, g5-xlarge; each folder's README names
the source of every file) and on edited copies that each show one fault.

The public outputs are excerpts: a thread shows two GPUs of eight, a cheat sheet one GPU's
NVLink. So each check is held to the catalog (gpuprov/catalog/instance_types.json) per unit
the recording covers: the GPU model and its PCI id, the links each GPU must have up, the EFA
interfaces of the whole instance; never to a count the excerpt cannot show."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov import catalog
from gpuprov.health import checks_gpu, parse
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section
from gpuprov.probes import test_rdma
from gpuprov.probes.conftest import Expectation

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"

# lspci's class names (pci.ids' class table) as the sysfs class codes gpuprov reads.
LSPCI_CLASSES = {"VGA compatible controller": "0x030000", "3D controller": "0x030200", "Bridge": "0x068000"}
_LSPCI_NVIDIA = re.compile(r"^([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ([^:]+): NVIDIA Corporation Device ([0-9a-f]{4})\b")


def sysfs_census(lspci: str) -> str:
    """FIXTURE: plain `lspci` output (no -n: devices named "Device 20b0", as the recordings
    print them) as the census lines gpuprov's gather and catalog.PCI_READ print from sysfs
    ("/sys/bus/pci/devices/ADDR vendor=0x10de device=0x20b0 class=0x030200"). NVIDIA functions
    only, as the census keeps; a class lspci names but the table lacks fails the test."""
    out = []
    for line in lspci.splitlines():
        match = _LSPCI_NVIDIA.match(line)
        if match:
            slot, cls, device = match.groups()
            out.append(f"/sys/bus/pci/devices/0000:{slot} vendor=0x10de device=0x{device} class={LSPCI_CLASSES[cls]}")
    return "\n".join(out)


def text(path: str) -> str:
    return (REC / path).read_text()


# -- the PCI bus: lspci of a p4d (aws/aws-ofi-nccl issue 64) ---------------------------------

@pytest.mark.parametrize(("recording", "gpus"), [("p4d-24xlarge/lspci.txt", 4),
                                                 ("p4d-24xlarge-edited-gpu-missing/lspci.txt", 3)])
def test_the_p4d_pci_bus_shows_a100s_by_their_pci_id(recording: str, gpus: int) -> None:
    bus = catalog.parse_pci(sysfs_census(text(recording)))
    # The excerpt ends before the NVSwitch functions (README): GPUs of two PCI buses only.
    assert bus == {"gpu_device_ids": ["0x20b0"] * gpus, "nvswitches": 0}
    # 10de:20b0 is the A100 SXM4 40GB: the model the catalog gives p4d.24xlarge.
    assert {catalog.GPU_BY_PCI_DEVICE[d] for d in bus["gpu_device_ids"]} == {catalog.get("p4d.24xlarge").gpu_model}
    # Amazon's own VGA function (00:03.0) and the EFA functions are no NVIDIA GPU.
    assert "00:03.0" not in sysfs_census(text(recording))


def test_a_gpu_gone_from_the_p4d_bus_fails_gpu_count_naming_both_counts() -> None:
    """The recording's GPUs held to themselves (4 shown, 4 expected), then one line removed."""
    expect = Expect(instance_type="p4d.24xlarge", gpus=4, gpu_model="A100")
    healthy = checks_gpu.gpu_count(Facts({"pci": Section(sysfs_census(text("p4d-24xlarge/lspci.txt")), 0)}), expect)
    gone = checks_gpu.gpu_count(
        Facts({"pci": Section(sysfs_census(text("p4d-24xlarge-edited-gpu-missing/lspci.txt")), 0)}), expect)
    assert healthy.status == "pass", healthy
    assert gone.status == "fail", gone
    assert gone.found == "3 NVIDIA GPU(s) on the PCI bus (A100)"
    assert gone.expected == "4 x A100 (p4d.24xlarge)"


# -- NVLink: nvidia-smi nvlink -s of a p4de (12 links) and of a Bottlerocket H100 node (18) ---

NVLINK = [("p4d.24xlarge", "p4d-24xlarge", 12, 1), ("p5.48xlarge", "p5-48xlarge", 18, 2)]


@pytest.mark.parametrize(("itype", "folder", "links", "gpus"), NVLINK)
def test_every_recorded_gpu_has_the_catalogs_nvlink_count_up(itype: str, folder: str, links: int, gpus: int) -> None:
    found = parse.nvlink_status(text(f"{folder}/nvlink-s.txt"))
    assert [(g.gpu, g.active, g.inactive) for g in found] == [(f"GPU {i}", links, []) for i in range(gpus)]
    assert Expect(instance_type=itype).nvlink_per_gpu == links
    row = checks_gpu.nvlink(Facts({"nvlink": Section(text(f"{folder}/nvlink-s.txt"), 0)}),
                            Expect(instance_type=itype, gpus=gpus))
    assert row.status == "pass", row
    assert row.expected == f"{links} NVLink links up on each of {gpus} GPU(s) (catalog, {itype})"


@pytest.mark.parametrize(("itype", "folder", "down", "gpus"), [
    ("p4d.24xlarge", "p4d-24xlarge-edited-nvlink-down", "GPU 0: 11 up, links 5 inactive", 1),
    ("p5.48xlarge", "p5-48xlarge-edited-nvlink-down", "GPU 1: 17 up, links 7 inactive", 2),
])
def test_one_link_down_fails_the_nvlink_check_naming_the_gpu_and_link(itype: str, folder: str, down: str,
                                                                       gpus: int) -> None:
    row = checks_gpu.nvlink(Facts({"nvlink": Section(text(f"{folder}/nvlink-s.txt"), 0)}),
                            Expect(instance_type=itype, gpus=gpus))
    assert row.status == "fail", row
    assert down in row.found
    assert row.expected.startswith(f"{Expect(instance_type=itype).nvlink_per_gpu} NVLink links up on each")
    assert "reset the GPUs" in row.action


# -- EFA: gpuprov's probe runs its own command line on the recorded fi_info ------------------

class RecordedHost:
    """FIXTURE: testinfra's host for a probe. Each command line runs in a real shell whose PATH
    starts with stubs: a recorded tool prints its recording, `systemd-detect-virt` says "none"
    (the recorded machines are EC2 VMs). The EFA installer's prefix in a command is dropped so
    that its fi_info is the stub; nothing else of the command changes."""

    def __init__(self, bindir: Path, tools: dict[str, Path]) -> None:
        bindir.mkdir()
        scripts = {name: f"cat {shlex.quote(str(path))}" for name, path in tools.items()}
        scripts["systemd-detect-virt"] = "echo none; exit 1"
        for name, body in scripts.items():
            stub = bindir / name
            stub.write_text(f"#!/bin/sh\n{body}\n")
            stub.chmod(0o755)
        self.path = f"{bindir}:/usr/bin:/bin"

    def run(self, command: str) -> SimpleNamespace:
        command = command.replace(f"{test_rdma.EFA_PREFIX}/efa/bin/", "")
        done = subprocess.run(["sh", "-c", command], env={"PATH": self.path}, capture_output=True, text=True,
                              timeout=20, check=False)
        return SimpleNamespace(stdout=done.stdout, stderr=done.stderr, rc=done.returncode)


def p4d_expectation() -> Expectation:
    return Expectation(node="p4d-1", instance_type="p4d.24xlarge", gpus=8, gpu_model="A100", nvswitch=True,
                       virtualization="vm")


@pytest.mark.parametrize("recording", ["fi_info-efa-rdm.txt", "fi_info-efa-rdm-libfabric-1.11.txt"])
def test_the_efa_probe_passes_on_the_four_recorded_interfaces(tmp_path: Path, recording: str) -> None:
    # Today's libfabric (fabric "efa", version 119.0) and an older one (fabric "EFA-fe80::...",
    # 111.20) on a p4d.24xlarge: the same four rdmap interfaces.
    host = RecordedHost(tmp_path / "bin", {"fi_info": REC / "p4d-24xlarge" / recording})
    said: list[str] = []
    test_rdma.test_efa_interfaces_match_the_catalog(host, p4d_expectation(), said.append)
    assert said == ["fi_info -p efa: 4 interface(s)"]
    assert catalog.get("p4d.24xlarge").efa_max_interfaces == 4


def test_the_efa_probe_fails_on_a_missing_interface_naming_both_counts(tmp_path: Path) -> None:
    host = RecordedHost(tmp_path / "bin", {"fi_info": REC / "p4d-24xlarge-edited-efa-missing/fi_info-efa-rdm.txt"})
    with pytest.raises(AssertionError, match=r"expected 4 EFA interface\(s\) \(catalog\), fi_info -p efa lists 3"):
        test_rdma.test_efa_interfaces_match_the_catalog(host, p4d_expectation(), lambda _text: None)


# -- nvidia-smi -q of a g5 (NVIDIA/k8s-device-plugin issue 344) --------------------

def test_the_g5_report_names_one_a10g_as_the_catalog_says() -> None:
    report = parse.smi_q(text("g5-xlarge/nvidia-smi-q-head.txt"))
    g5 = catalog.get("g5.xlarge")
    assert list(report) == ["00000000:00:1E.0"]
    assert len(report) == g5.gpu_count
    assert parse.at(report["00000000:00:1E.0"], "Product Name") == f"NVIDIA {g5.gpu_model}"
    assert parse.at(report["00000000:00:1E.0"], "MIG Mode", "Current") == "N/A"
