"""Probes for RDMA/GPUDirect settings (role rdma): memlock, NCCL configuration,
RDMA userspace, nvidia-peermem, EFA interfaces."""

from __future__ import annotations

import json
import re

import pytest

from gpuprov import catalog
from gpuprov.node_text import memlock_text
from gpuprov.probes.nodefacts import (
    in_container,
    installed_version,
    nvidia_pci,
    rdma_adapters,
    read_text,
    require_systemd,
)

IB_PACKAGES = ("rdma-core", "ibverbs-utils", "infiniband-diags")
EFA_PREFIX = "/opt/amazon"


def _efa_interfaces(expect) -> int:
    """EFA interfaces the catalog gives this node's type (0: not an EFA type)."""
    if not expect.instance_type or expect.instance_type in ("unknown", "docker-node"):
        return 0
    try:
        itype = catalog.get(expect.instance_type)
    except Exception:  # noqa: BLE001  (an unknown type has no catalog facts)
        return 0
    return itype.efa_max_interfaces if itype.efa else 0


def _memlock_ceiling(host) -> str:
    """The hard memlock limit of PID 1: what a container's engine allows."""
    return host.run("awk '/^Max locked memory/ { print $5 }' /proc/1/limits").stdout.strip()


def _skip_if_capped(host) -> None:
    ceiling = _memlock_ceiling(host)
    if in_container(host) and ceiling != "unlimited":
        pytest.skip(f"container node: its engine caps memlock at {memlock_text(ceiling, 1)} and the node "
                    "cannot raise it (run the node with --ulimit memlock=-1)")


@pytest.mark.rdma
def test_memlock_unlimited_for_users(host, report):
    _skip_if_capped(host)
    found = host.run("runuser -u nobody -- sh -c 'ulimit -l; ulimit -Hl'").stdout.split()
    assert found == ["unlimited", "unlimited"], (
        f"expected memlock soft and hard 'unlimited' for a user session, found {found}")
    report("memlock unlimited (soft and hard) in a user session")


@pytest.mark.rdma
def test_memlock_unlimited_for_services(host, report):
    _skip_if_capped(host)
    require_systemd(host)
    out = host.run("systemd-run --wait --pipe --quiet sh -c 'ulimit -l'")
    assert out.stdout.strip() == "unlimited", (
        f"expected memlock 'unlimited' in a systemd service, found {out.stdout.strip() or out.stderr.strip()}")
    report("memlock unlimited in a systemd service (DefaultLimitMEMLOCK)")


@pytest.mark.rdma
def test_memlock_unlimited_in_containers(host, report):
    _skip_if_capped(host)
    if host.run("command -v docker").rc != 0:
        pytest.skip("no container engine on this node (Docker is not installed)")
    config = json.loads(host.run("cat /etc/docker/daemon.json").stdout or "{}")
    memlock = (config.get("default-ulimits") or {}).get("memlock") or {}
    assert memlock.get("Soft") == -1 and memlock.get("Hard") == -1, (
        f"expected default-ulimits memlock -1/-1 in /etc/docker/daemon.json, found {memlock or 'none'}")
    image = host.run("docker images -q | head -1").stdout.strip()
    if image:
        inside = host.run(f"docker run --rm {image} sh -c 'ulimit -l'").stdout.strip()
        assert inside == "unlimited", f"expected memlock 'unlimited' inside a container, found {inside}"
    report("Docker default-ulimits memlock unlimited" + (", checked inside a container" if image else ""))


@pytest.mark.rdma
def test_nccl_conf_has_the_expected_keys(host, expect, report):
    conf = read_text(host, "/etc/nccl.conf")
    assert conf is not None, "expected /etc/nccl.conf, found none"
    keys = dict(ln.split("=", 1) for ln in conf.splitlines()
                if "=" in ln and not ln.startswith("#"))
    ifname = keys.get("NCCL_SOCKET_IFNAME", "")
    excluded = ifname[1:].split(",") if ifname.startswith("^") else []
    assert "lo" in excluded and "docker" in excluded, (
        f"expected NCCL_SOCKET_IFNAME to exclude lo and docker bridges (^lo,docker,...), found '{ifname}'")
    env = read_text(host, "/etc/profile.d/gpuprov-nccl.sh") or ""
    if _efa_interfaces(expect):
        assert re.search(r"^export FI_PROVIDER=efa$", env, re.M), (
            f"expected FI_PROVIDER=efa in /etc/profile.d/gpuprov-nccl.sh on {expect.instance_type}, found none")
    report(f"/etc/nccl.conf: {', '.join(f'{k}={v}' for k, v in sorted(keys.items()))}")


@pytest.mark.rdma
def test_rdma_userspace_present(host, expect, report):
    if _efa_interfaces(expect):
        lock = expect.lock()
        want = lock.get("efa_installer")
        found = host.run(f"sed -n 's/^# EFA installer version: *//p' {EFA_PREFIX}/efa_installed_packages"
                         " 2>/dev/null").stdout.strip()
        assert found == want, f"expected EFA installer {want} installed, found {found or 'none'}"
        assert host.file(f"{EFA_PREFIX}/efa/bin/fi_info").exists, f"expected {EFA_PREFIX}/efa/bin/fi_info"
        report(f"EFA installer {found}: libfabric in {EFA_PREFIX}/efa")
        return
    found = {p: installed_version(host, p) for p in IB_PACKAGES}
    missing = sorted(p for p, v in found.items() if v is None)
    assert not missing, f"expected {', '.join(IB_PACKAGES)} installed, missing {missing}"
    report(", ".join(f"{p} {v}" for p, v in found.items()))


@pytest.mark.rdma
def test_nvidia_peermem_configured(host, expect, report):
    if _efa_interfaces(expect):
        pytest.skip(f"{expect.instance_type} uses EFA, whose GPUDirect path needs no nvidia-peermem")
    # A node expected to have GPUs is judged even when its bus shows none (gpus_on_pci_bus says
    # why): its boot configuration does not depend on the GPU being there.
    if nvidia_pci(host)["gpus"] == 0 and not expect.gpus:
        pytest.skip(expect.why_no_gpu())
    if not in_container(host) and not rdma_adapters(host):
        # nvidia-peermem serves an InfiniBand/RoCE adapter; with none (a one-GPU VM: the real H200
        # of tests/fixtures/recordings/h200-580) GPUDirect RDMA cannot exist here, as `gpuprov
        # health`'s peermem check says too. (A container sees its host's adapters, not its own:
        # it is judged on its configuration.)
        pytest.skip("no InfiniBand/RoCE device in /sys/class/infiniband: GPUDirect RDMA has no adapter here")
    conf = host.run("cat /etc/modules-load.d/*.conf 2>/dev/null").stdout.split()
    assert "nvidia-peermem" in conf, "expected nvidia-peermem in /etc/modules-load.d, found it absent"
    if not in_container(host):
        assert host.file("/sys/module/nvidia_peermem").exists, "expected nvidia_peermem loaded, it is not"
    report("nvidia-peermem loads at boot" + ("" if in_container(host) else " and is loaded"))


@pytest.mark.rdma
def test_efa_interfaces_match_the_catalog(host, expect, report):
    want = _efa_interfaces(expect)
    if not want:
        pytest.skip(f"{expect.instance_type or 'this node'} has no EFA (catalog)")
    if in_container(host):
        pytest.skip("container node: no EFA devices of its own")
    found = host.run(f"{EFA_PREFIX}/efa/bin/fi_info -p efa -t FI_EP_RDM | grep -c 'domain:'").stdout.strip()
    assert found == str(want), f"expected {want} EFA interface(s) (catalog), fi_info -p efa lists {found or 0}"
    report(f"fi_info -p efa: {found} interface(s)")
