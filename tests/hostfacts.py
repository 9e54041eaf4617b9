"""What this machine is, read from it: the expectations of tests that depend on the host.

Local nodes are containers on this machine's kernel: they see its /proc/cpuinfo, so what a
probe finds there (the CPU vendor, hence which microcode package and setting apply) is
this machine's, and a test must read it here rather than assume the vendor it was first
written on (CI runs on Intel and on AMD machines of the same kind).
"""

from __future__ import annotations

from pathlib import Path

# vendor_id -> (package, its early-loading file, the key that file must set to "early"):
# Debian's intel-microcode and amd64-microcode packages.
MICROCODE = {
    "GenuineIntel": ("intel-microcode", "/etc/default/intel-microcode", "IUCODE_TOOL_INITRAMFS"),
    "AuthenticAMD": ("amd64-microcode", "/etc/default/amd64-microcode", "AMD64UCODE_INITRAMFS"),
}


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first processor's vendor_id ('' when the kernel does not say)."""
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return value.strip()
    return ""


def microcode() -> tuple[str, str, str] | None:
    """This machine's (package, file, key) for CPU microcode; None for a vendor with none."""
    return MICROCODE.get(cpu_vendor())
