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


def installed_kernels(host: Any) -> list[str]:
    """Kernels the node has an image or headers for, plus the one it runs (unless a container)
    and the one its next boot loads (/boot/vmlinuz)."""
    out = host.run(
        "dpkg-query -W -f='${Status}\\t${Package}\\n' 'linux-image-[0-9]*' 'linux-headers-[0-9]*' "
        "2>/dev/null | awk -F'\\t' '$1 ~ / installed$/ && $2 !~ /-common$/ "
        '{ sub(/^linux-(image|headers)-/, "", $2); print $2 }\''
    ).stdout.split()
    kernels = set(out)
    if not in_container(host):
        kernels.add(host.run("uname -r").stdout.strip())
        nxt = host.run("readlink -f /boot/vmlinuz").stdout.strip()
        if nxt.startswith("/boot/vmlinuz-"):
            kernels.add(nxt.removeprefix("/boot/vmlinuz-"))
    return sorted(kernels)


def installed_version(host: Any, package: str) -> str | None:
    pkg = host.package(package)
    return pkg.version if pkg.is_installed else None


def require_systemd(host: Any) -> None:
    """Fail with the reason, not a shell error, on a node whose PID 1 is not systemd: gpuprov's
    roles run services and units (sd_booted(3): systemd booted the node when
    /run/systemd/system is a directory)."""
    if host.file("/run/systemd/system").is_directory:
        return
    init = host.run("cat /proc/1/comm").stdout.strip() or "unknown"
    raise AssertionError(f"expected a node run by systemd, found PID 1 '{init}' (no /run/systemd/system): "
                         "gpuprov's roles need systemd for their services")


def rdma_adapters(host: Any) -> dict[str, str]:
    """The InfiniBand/RoCE adapters in /sys/class/infiniband: {device: its kernel driver}, EFA's
    left out (what gpuprov health's peermem check reads: gpuprov/health/gather.py "infiniband")."""
    out = host.run('for d in /sys/class/infiniband/*; do [ -e "$d" ] && '
                   'echo "$(basename "$d") $(basename "$(readlink -f "$d/device/driver")")"; done; true').stdout
    found = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return {device: driver for device, driver in found.items() if driver != "efa"}
