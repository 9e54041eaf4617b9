"""Parsers for what nvidia-smi says of MIG on a node: the GPU instance profiles a GPU offers
(`nvidia-smi mig -lgip`), the GPU and compute instances present (`mig -lgi`, `mig -lci`), the
GPUs and their MIG devices (`nvidia-smi -L`), and each GPU's MIG mode, current and pending a
reset (`nvidia-smi -q` and `nvidia-smi -x -q`). Each takes the text the tool printed and returns
plain data; tested on recordings of real machines (tests/fixtures/recordings/, each with its
source), never on output typed to fit."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass

# `mig -lgip`: "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |"
# (a second line of each block carries CE, JPEG and OFA: not read).
_PROFILE = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\S+\s+(\d+)\s")
# `mig -lgi`: "|   0  MIG 1g.10gb         19        9          2:1     |"
_GI = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|")
# `mig -lci`: "|   0      7       MIG 1g.5gb           0         0          0:1     |"
_CI = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s+\|")
# `-L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-de57...)" and, under it, each MIG device:
# "  MIG 1g.10gb     Device  0: (UUID: MIG-feb8...)" (drivers before R470: "MIG-GPU-<uuid>/GI/CI").
_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")
_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[0-9A-Za-z/-]+)\)\s*$")
# `-q`: "GPU 00000000:00:06.0" opens a GPU's report.
_BUS = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


@dataclass(frozen=True)
class Profile:
    gpu: int
    name: str  # 1g.10gb, 1g.10gb+me
    id: int  # the profile id `mig -cgi` takes
    free: int
    total: int  # instances of it one GPU can hold
    memory_gib: float
    sms: int


@dataclass(frozen=True)
class GpuInstance:
    gpu: int
    name: str
    profile_id: int
    id: int
    placement: tuple[int, int]  # start, size


@dataclass(frozen=True)
class ComputeInstance:
    gpu: int
    gpu_instance: int
    name: str
    profile_id: int
    id: int
    placement: tuple[int, int]


@dataclass(frozen=True)
class MigDevice:
    name: str
    index: int
    uuid: str  # what CUDA_VISIBLE_DEVICES names


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    mig: tuple[MigDevice, ...]


@dataclass(frozen=True)
class MigMode:
    gpu: str  # the PCI bus id (00000000:00:06.0)
    current: str  # Enabled, Disabled, N/A (no MIG on this GPU)
    pending: str  # what it becomes at the next GPU reset
    devices: int  # MIG devices listed (-x -q's <mig_devices>; -q: not counted, 0)

    @property
    def reset_pending(self) -> bool:
        return self.pending != self.current


def profiles(text: str) -> list[Profile]:
    """`nvidia-smi mig -lgip`."""
    return [Profile(gpu=int(m[1]), name=m[2], id=int(m[3]), free=int(m[4]), total=int(m[5]),
                    memory_gib=float(m[6]), sms=int(m[7]))
            for m in (_PROFILE.match(line) for line in text.splitlines()) if m]


def gpu_instances(text: str) -> list[GpuInstance]:
    """`nvidia-smi mig -lgi` ("No GPU instances found": none)."""
    return [GpuInstance(gpu=int(m[1]), name=m[2], profile_id=int(m[3]), id=int(m[4]),
                        placement=(int(m[5]), int(m[6])))
            for m in (_GI.match(line) for line in text.splitlines()) if m]


def compute_instances(text: str) -> list[ComputeInstance]:
    """`nvidia-smi mig -lci`."""
    return [ComputeInstance(gpu=int(m[1]), gpu_instance=int(m[2]), name=m[3], profile_id=int(m[4]),
                            id=int(m[5]), placement=(int(m[6]), int(m[7])))
            for m in (_CI.match(line) for line in text.splitlines()) if m]


def instances_per_gpu(found: list[GpuInstance]) -> dict[int, Counter[str]]:
    """{GPU index: {profile name: GPU instances}}."""
    out: dict[int, Counter[str]] = {}
    for gi in found:
        out.setdefault(gi.gpu, Counter())[gi.name] += 1
    return out


def gpus(text: str) -> list[Gpu]:
    """`nvidia-smi -L`: each GPU with the MIG devices listed under it."""
    found: list[tuple[int, str, str, list[MigDevice]]] = []
    for line in text.splitlines():
        gpu = _GPU.match(line)
        if gpu:
            found.append((int(gpu[1]), gpu[2], gpu[3], []))
            continue
        mig = _MIG.match(line)
        if mig and found:
            found[-1][3].append(MigDevice(name=mig[1], index=int(mig[2]), uuid=mig[3]))
    return [Gpu(index=i, name=name, uuid=uuid, mig=tuple(migs)) for i, name, uuid, migs in found]


def mig_modes_xml(text: str) -> list[MigMode]:
    """`nvidia-smi -x -q`: each GPU's <mig_mode> (<current_mig>, <pending_mig>) and how many
    <mig_device> its <mig_devices> holds ("None": 0)."""
    start = text.find("<?xml")
    end = text.rfind("</nvidia_smi_log>")
    if start < 0 or end < 0:
        return []
    root = ET.fromstring(text[start:end + len("</nvidia_smi_log>")])
    return [MigMode(gpu=gpu.get("id", ""), current=(gpu.findtext("mig_mode/current_mig") or "N/A").strip(),
                    pending=(gpu.findtext("mig_mode/pending_mig") or "N/A").strip(),
                    devices=len(gpu.findall("mig_devices/mig_device")))
            for gpu in root.findall("gpu")]


def mig_modes(text: str) -> list[MigMode]:
    """`nvidia-smi -q`: each GPU's "MIG Mode" section (Current, Pending)."""
    found: list[MigMode] = []
    bus, section = "", ""
    mode: dict[str, str] = {}
    for line in text.splitlines():
        head = _BUS.match(line)
        if head:
            bus, section, mode = head[1], "", {}
            continue
        key, sep, value = line.strip().partition(":")
        if not sep and key == "MIG Mode":
            section = "MIG Mode"
        elif section == "MIG Mode" and sep and key.strip() in ("Current", "Pending"):
            mode[key.strip()] = value.strip()
            if len(mode) == 2:
                found.append(MigMode(gpu=bus, current=mode["Current"], pending=mode["Pending"], devices=0))
                section = ""
    return found
