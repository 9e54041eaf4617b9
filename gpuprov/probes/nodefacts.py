"""Readings probes take on the node itself (never from expectations)."""

from __future__ import annotations

from typing import Any


def in_container(host: Any) -> str | None:
    """The container technology the node runs in, as the node itself says; None on a VM/metal."""
    cmd = host.run("systemd-detect-virt --container")
    kind = cmd.stdout.strip()
    return kind if cmd.rc == 0 and kind and kind != "none" else None


def nvidia_pci(host: Any) -> dict[str, int]:
    """NVIDIA GPUs and NVSwitches on the node's PCI bus, read from sysfs by the probe itself."""
    out = host.run(
        "for d in /sys/bus/pci/devices/*; do "
        '[ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && cat $d/class; done; true'
    ).stdout.split()
    return {
        "gpus": sum(1 for c in out if c.startswith(("0x0300", "0x0302"))),
        "nvswitches": sum(1 for c in out if c.startswith("0x0680")),
    }
