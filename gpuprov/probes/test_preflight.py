"""Probes for what the gpu_preflight role guarantees."""

from __future__ import annotations

import json
import re

import pytest

from gpuprov.probes.nodefacts import in_container, nvidia_pci

pytestmark = pytest.mark.preflight

SUPPORTED = {("ubuntu", "20.04"), ("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}
# Package names unattended-upgrades must leave alone, and one it may touch.
GPU_PACKAGES = ["nvidia-driver", "libnvidia-compute-535", "cuda-toolkit-11-8", "libcudnn8", "libnccl2"]


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


def test_unattended_upgrades_leave_gpu_packages(host, report):
    dump = host.run("apt-config dump Unattended-Upgrade::Package-Blacklist")
    assert dump.rc == 0, f"apt-config failed: {dump.stderr.strip()}"
    patterns = re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.*)";$', dump.stdout, re.M)
    unguarded = [p for p in GPU_PACKAGES if not any(re.match(rx, p) for rx in patterns)]
    assert not unguarded, f"expected unattended-upgrades to skip {unguarded}; its blacklist is {patterns}"
    assert not any(re.match(rx, "openssl") for rx in patterns), (
        f"blacklist {patterns} also blocks ordinary security updates (openssl)"
    )
    installed = host.package("unattended-upgrades").is_installed
    report(f"blacklist {patterns} (unattended-upgrades {'installed' if installed else 'not installed'})")


def test_kernel_headers_for_running_kernel(host, report):
    container = in_container(host)
    if container:
        pytest.skip(f"{container} container: runs the host's kernel, has no headers of its own")
    kernel = host.run("uname -r").stdout.strip()
    build = host.file(f"/lib/modules/{kernel}/build")
    assert build.exists, f"expected headers for kernel {kernel} (/lib/modules/{kernel}/build), found none"
    report(f"headers present for {kernel}")


def test_gpu_fact_matches_pci_bus(host, report):
    fact = host.file("/etc/ansible/facts.d/gpu.fact")
    assert fact.exists and fact.mode & 0o111, "expected an executable /etc/ansible/facts.d/gpu.fact"
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
