"""Parsers for the raw outputs `gpuprov health` gathers (gpuprov.health.gather): each takes
the text a tool printed and returns plain data. Tested on recordings of real machines
(tests/fixtures/recordings/), never on output typed to fit."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

Tree = dict[str, Any]

# nvidia-smi's answer for a GPU it cannot reach: "Unable to determine the device handle for
# GPU0000:65:00.0: Unknown Error", "[GPU requires reset]", "ERR!", "[Unknown Error]".
_SMI_GPU_ERRORS = re.compile(r"Unable to determine the device handle|GPU requires reset|ERR!|Unknown Error"
                             r"|GPU is lost|No devices were found", re.I)


def query_csv(text: str) -> tuple[list[dict[str, str]], list[str]]:
    """`nvidia-smi --format=csv --query-gpu=...` with its header line: one dict per GPU (by
    the header's field names, units left out), and the lines that are no GPU row (errors)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header: list[str] | None = None
    rows: list[dict[str, str]] = []
    errors: list[str] = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if header is None and cells and cells[0] == "index":
            header = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
        elif header is not None and len(cells) == len(header) and cells[0].isdigit():
            rows.append(dict(zip(header, cells, strict=True)))
        else:
            errors.append(line.strip())
    return rows, errors


def smi_errors(lines: list[str]) -> list[str]:
    """The lines of nvidia-smi's output that say a GPU (or the driver) did not answer."""
    return [ln for ln in lines if _SMI_GPU_ERRORS.search(ln) or "NVML" in ln or "mismatch" in ln]


def smi_q(text: str) -> dict[str, Tree]:
    """`nvidia-smi -q [-d ...]` (text): per GPU (by its PCI bus id), the indented report as a
    tree of sections ({name: subtree}) and values ({name: "value"})."""
    gpus: dict[str, Tree] = {}
    stack: list[tuple[int, Tree]] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        gpu = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", raw)
        if gpu:
            # One block per GPU and -d section: blocks of the same GPU add to one tree.
            stack = [(0, gpus.setdefault(gpu.group(1), {}))]
            continue
        if not stack:
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        key, sep, value = raw.strip().partition(":")
        parent = stack[-1][1]
        if sep and value.strip():
            parent[key.strip()] = value.strip()
        else:
            child: Tree = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return gpus


def at(tree: Tree, *path: str) -> Any:
    """The value or subtree at ``path`` (the first of several names that is there), else None."""
    node: Any = tree
    for step in path:
        if not isinstance(node, dict):
            return None
        names = step.split("|")
        node = next((node[n] for n in names if n in node), None)
    return node


def number(value: Any) -> int | None:
    """The leading integer of a reading ("33 C", "0", "-2 C"); None for "N/A" and the like."""
    match = re.match(r"^\s*(-?\d+)", value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class GpuLinks:
    gpu: str
    active: int
    inactive: list[int] = field(default_factory=list)


def nvlink_status(text: str) -> list[GpuLinks]:
    """`nvidia-smi nvlink -s`: per GPU, its active links and the numbers of the inactive ones
    ("Link 3: <inactive>"). No GPU lines (one GPU, or NVLink off): an empty list."""
    out: list[GpuLinks] = []
    gpu: str | None = None
    active, inactive = 0, list[int]()
    for line in text.splitlines():
        head = re.match(r"^GPU (\d+): (.*)$", line.strip())
        link = re.match(r"^Link (\d+): (.*)$", line.strip())
        if head:
            if gpu is not None:
                out.append(GpuLinks(gpu, active, inactive))
            gpu, active, inactive = f"GPU {head.group(1)}", 0, []
        elif link and gpu is not None:
            if "inactive" in link.group(2).lower():
                inactive.append(int(link.group(1)))
            else:
                active += 1
    if gpu is not None:
        out.append(GpuLinks(gpu, active, inactive))
    return out


def driver_of_proc(text: str) -> str | None:
    """The running kernel module's release in /proc/driver/nvidia/version ("NVRM version:
    NVIDIA UNIX Open Kernel Module for x86_64  580.159.04 ..." or the proprietary form)."""
    match = re.search(r"NVRM version: NVIDIA UNIX .*?Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None


def infiniband(text: str) -> dict[str, str]:
    """/sys/class/infiniband as the gather script lists it: {device: its kernel driver}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def fabricmanager_packages(text: str) -> dict[str, str]:
    """dpkg-query's installed fabric manager packages: {package: version} ("ii" only)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ii":
            out[parts[1]] = parts[2]
    return out
