"""Probes for what the gpu_preflight role guarantees."""

from __future__ import annotations

import json
import re

import pytest

from gpuprov.lock.lock_data import LockData
from gpuprov.probes.nodefacts import file_stat, in_container, nvidia_pci

pytestmark = pytest.mark.preflight

SUPPORTED = {("ubuntu", "20.04"), ("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12"), ("debian", "13")}
# Package names unattended-upgrades must leave alone: one of each name family the roles install,
# whatever the branch or flavour (Debian's, and NVIDIA's proprietary and open names).
GPU_PACKAGES = ["nvidia-driver", "nvidia-driver-580-open", "nvidia-dkms-580", "libnvidia-compute-535",
                "nvidia-fabricmanager-535", "nvidia-fabricmanager", "cuda-toolkit-11-8", "libcudnn8", "libnccl2"]
# Packages whose security updates unattended-upgrades must keep applying: prefix patterns
# such as ^libcu and ^libnv matched these too (libcurl, CUPS, NVMe, ZFS, cupt, texture tools).
MUST_STAY_UPGRADABLE = [
    "libcurl4", "libcurl3-gnutls", "libcurl3-nss", "libcups2", "libcupsimage2", "libcupsfilters1",
    "libcue2", "libcunit1", "libcupt4-2", "libnvme1", "libnvpair3linux", "libnvtt2",
    "openssl", "libssl3",
]
BLACKLIST_KEY = "Unattended-Upgrade::Package-Blacklist"


def blacklist_patterns(dump: str) -> list[str]:
    """The patterns of ``apt-config dump`` output, every fragment merged, in order, once each."""
    found = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump, re.M)
    return list(dict.fromkeys(found))


def blocked(patterns: list[str], package: str) -> list[str]:
    """The patterns that keep ``package`` from unattended-upgrades (its own test: re.match)."""
    return [rx for rx in patterns if re.match(rx, package)]


def test_os_supported(host, report):
    info = host.system_info
    release = info.release.split(".")[0] if info.distribution == "debian" else info.release
    found = (info.distribution, release)
    assert found in SUPPORTED, f"expected one of {sorted(SUPPORTED)}, found {found}"
    report(f"{info.distribution} {info.release} ({info.codename})")


def test_dpkg_consistent(host, report):
    audit = host.run("dpkg --audit")
    assert audit.rc == 0 and not audit.stdout.strip(), (
        f"expected no half-installed packages, dpkg --audit says: {audit.stdout.strip()[:300]}"
    )
    report("dpkg --audit: nothing to report")


def locked_packages(lock: LockData | None) -> list[str]:
    """The package names the node's lock installs (driver, pinning, fabric manager, CUDA,
    cuDNN; a line that comes as archives names none): what the families above stand for on this
    node, checked by name."""
    packages = (lock or {}).get("packages") or {}
    names: list[str] = []
    for key in ("driver", "pinning", "fabricmanager", "cuda", "cudnn"):
        value = packages.get(key) or []
        names.extend([value] if isinstance(value, str) else value)
    return [n for n in dict.fromkeys(names) if n]


def test_unattended_upgrades_leave_gpu_packages(host, report, expect):
    dump = host.run(f"apt-config dump {BLACKLIST_KEY}")
    assert dump.rc == 0, f"apt-config failed: {dump.stderr.strip()}"
    patterns = blacklist_patterns(dump.stdout)
    own = [p for p in locked_packages(expect.stack) if p not in GPU_PACKAGES]
    unguarded = [p for p in GPU_PACKAGES + own if not blocked(patterns, p)]
    assert not unguarded, f"expected unattended-upgrades to skip {unguarded}; its blacklist is {patterns}"
    overreach = {p: blocked(patterns, p) for p in MUST_STAY_UPGRADABLE if blocked(patterns, p)}
    assert not overreach, (
        f"expected only GPU packages excluded from unattended-upgrades, but these must stay "
        f"upgradable and are blocked: {overreach}"
    )
    installed = host.package("unattended-upgrades").is_installed
    report(f"blacklist {patterns} (the lock's {len(own)} package names besides the families); "
           f"{len(MUST_STAY_UPGRADABLE)} other packages stay upgradable "
           f"(unattended-upgrades {'installed' if installed else 'not installed'})")


def test_kernel_headers_for_running_kernel(host, report):
    container = in_container(host)
    if container:
        pytest.skip(f"{container} container: runs the host's kernel, has no headers of its own")
    kernel = host.run("uname -r").stdout.strip()
    build = host.file(f"/lib/modules/{kernel}/build")
    assert build.exists, f"expected headers for kernel {kernel} (/lib/modules/{kernel}/build), found none"
    report(f"headers present for {kernel}")


@pytest.mark.base
def test_gpu_fact_matches_pci_bus(host, report):
    fact = file_stat(host, "/etc/ansible/facts.d/gpu.fact")
    assert fact and fact.mode & 0o111, "expected an executable /etc/ansible/facts.d/gpu.fact"
    out = host.run("/etc/ansible/facts.d/gpu.fact")
    assert out.rc == 0, f"gpu.fact failed: {out.stderr.strip()}"
    data = json.loads(out.stdout)
    pci = nvidia_pci(host)
    assert data["gpu_count"] == pci["gpus"], (
        f"gpu.fact says {data['gpu_count']} GPUs, the PCI bus has {pci['gpus']}"
    )
    assert data["nvswitch_count"] == pci["nvswitches"], (
        f"gpu.fact says {data['nvswitch_count']} NVSwitches, the PCI bus has {pci['nvswitches']}"
    )
    report(f"gpu.fact: {data['gpu_count']} GPU(s), {data['nvswitch_count']} NVSwitch(es), agrees with sysfs")
