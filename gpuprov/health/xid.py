"""Xid errors in the kernel log, each classified by what the node needs: isolate, reboot,
reset or watch.

The table follows NVIDIA's Xid catalog for Ampere and newer GPUs, "Analyzing Xid Errors with
the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (its
"Resolution Bucket (Immediate Action)" column), mapped onto gpuprov's four actions:

- RESTART_APP, IGNORE (the application that hit it is affected, the GPU is fine) -> watch
- RESET_GPU -> reset (drain the node's jobs, reset the GPU or reboot the node)
- RESTART_BM, RESTART_VM -> reboot
- an event whose investigatory bucket is CONTACT_SUPPORT because the GPU could not protect
  itself (Xid 64: a row remap that failed) -> isolate (RMA)

The memory Xids (48, 63, 64, 94, 95) and what they mean for row remapping also follow
NVIDIA's "GPU Memory Error Management" guide,
https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/user-visible-statistics.html.
Xid 154 names the recovery action itself ("GPU recovery action changed from 0x0 (None) to
0x1 (GPU Reset Required)"): that text decides. An Xid not in the table is reported as watch,
named as unknown to gpuprov, so that it is looked up rather than hidden.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTIONS = ("isolate", "reboot", "reset", "watch")  # most severe first

ACTION_TEXT = {
    "isolate": "RMA: isolate the node (drain it, take it out of service, open a hardware case)",
    "reboot": "drain and reboot the node (a GPU reset cannot recover it); RMA if it recurs",
    "reset": "drain the node and reset the GPU (nvidia-smi -r -i GPU, or reboot the node); RMA if it recurs",
    "watch": "watch: no node action (an application's error, or an event the GPU handled)",
}

# Xid -> (what it is, action). Source: NVIDIA's Xid catalog (module docstring).
XIDS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing (idle timeout)", "watch"),
    13: ("graphics engine exception", "watch"),
    31: ("GPU memory page fault", "watch"),
    43: ("GPU stopped processing", "watch"),
    45: ("preemptive cleanup, due to previous errors", "watch"),
    48: ("double bit (uncorrectable) ECC error", "reset"),
    61: ("internal micro-controller breakpoint/warning", "reset"),
    62: ("internal micro-controller halt", "reset"),
    63: ("row remapping (or page retirement) recorded; active after a GPU reset", "reset"),
    64: ("row remapping (or page retirement) failed", "isolate"),
    68: ("video decoder exception", "watch"),
    69: ("graphics engine class error", "watch"),
    74: ("NVLink error", "reset"),
    79: ("GPU has fallen off the bus", "reboot"),
    92: ("high single-bit ECC error rate", "watch"),
    94: ("contained ECC error", "watch"),
    95: ("uncontained ECC error", "reset"),
    109: ("context switch timeout", "watch"),
    119: ("GSP RPC timeout", "reset"),
    120: ("GSP error", "reset"),
    121: ("C2C link corrected error", "watch"),
    140: ("unrecovered ECC error", "reset"),
    143: ("GPU initialization failure", "reset"),
    154: ("GPU recovery action changed", "watch"),
}

# Xid 154's recovery actions, as the driver names them in the line.
RECOVERY = {"gpu reset required": "reset", "drain and reset": "reset", "node reboot required": "reboot",
            "drain p2p": "reset", "none": "watch"}

# "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus" and the MIG form
# "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: ..."; older drivers leave out
# "PCI:". The driver's own "fallen off the bus" lines without an Xid mean the same as Xid 79.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+),?\s*(.*)")
_PCI = re.compile(r"\b([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?\b")


@dataclass(frozen=True)
class XidEvent:
    pci: str
    xid: int
    text: str
    what: str
    action: str


def classify(xid: int, text: str) -> tuple[str, str]:
    """(what it is, action) for an Xid and the rest of its line."""
    what, action = XIDS.get(xid, (f"Xid {xid}, not in gpuprov's table: look it up in NVIDIA's Xid catalog",
                                  "watch"))
    if xid == 154:
        match = re.search(r"to 0x[0-9a-fA-F]+ \(([^)]+)\)", text)
        if match:
            action = RECOVERY.get(match.group(1).strip().lower(), "reset")
            what = f"{what}: {match.group(1).strip()}"
    return what, action


def events(log: str) -> list[XidEvent]:
    """Every Xid in the kernel log (and every "fallen off the bus" the driver wrote without
    one), in log order."""
    out: list[XidEvent] = []
    last_pci = "?"
    for line in log.splitlines():
        match = _XID.search(line)
        if match:
            pci, xid, text = match.group(1).lower(), int(match.group(2)), match.group(3).strip()
            what, action = classify(xid, text)
            out.append(XidEvent(pci, xid, text, what, action))
            continue
        pci = _PCI.search(line)
        if pci and "NVRM" in line:
            last_pci = pci.group(1).lower()
        if "fallen off the bus" in line and "NVRM" in line:
            what, action = XIDS[79]
            out.append(XidEvent(last_pci, 79, line.split("NVRM:", 1)[-1].strip(), f"{what} (no Xid line)", action))
    # The driver writes both for one event: the Xid 79 line stands for its GPU.
    with_xid = {e.pci for e in out if e.xid == 79 and not e.what.endswith("(no Xid line)")}
    return [e for e in out if not (e.what.endswith("(no Xid line)") and e.pci in with_xid)]


def worst(found: list[XidEvent]) -> str | None:
    """The most severe action among ``found`` (ACTIONS' order), or None for none."""
    actions = {e.action for e in found}
    return next((a for a in ACTIONS if a in actions), None)


def summary(found: list[XidEvent]) -> str:
    """One line: each (GPU, Xid) once, with its count and action."""
    seen: dict[tuple[str, int], list[XidEvent]] = {}
    for e in found:
        seen.setdefault((e.pci, e.xid), []).append(e)
    parts = [f"Xid {xid} on {pci} x{len(es)} ({es[0].what}: {es[0].action})" for (pci, xid), es in seen.items()]
    return "; ".join(parts)
