"""A Debian 13 (trixie) local node through the real CLI: `up --provider docker --os debian13
--source distro`.

What is real: the node image gpuprov/node:trixie (debootstrap from trixie, systemd, sshd with
the bookworm image's hardening; `make node-image-trixie` builds it when it is missing or from an
older recipe, the first time about two minutes), the lock of Debian 13's own archive (driver
550.163.01, CUDA 12.4.131, NCCL 2.22.3), the SSH and Ansible path, and every package, from
trixie's archive through the package cache: nvidia-driver with nvidia-kernel-dkms, whose module
DKMS builds for the kernel headers of trixie (linux-headers-amd64, which a container node has to
be given: Debian 13's dkms recommends none), nvidia-cuda-toolkit 12.4.131 with its gcc 13
(nvcc compiles for sm_50 and sm_90), and libnccl2 2.22.3, held; cuDNN 9.10.2.21 for CUDA 12 from the
artifact mirror (NVIDIA's redist archive rebuilt from its wheel, checked by sha256); then the rest of
the site on trixie:
Docker 26.1.5 (docker.io with its docker-cli) and the container toolkit (the FIXTURE repository),
rdma-core 56.1, trixie's pinned microcode. The probes prove each.

The proprietary module, not the open one: trixie's nvidia-open-kernel-dkms 550.163.01-2 does
not build for trixie's kernels (gpuprov/data/stack.toml, [os.debian13.sources.distro]), so the
lock refuses the open flavour there, and this file checks that refusal too.

The whole site runs (since 2026-12-01; before, `--tags preflight,driver,cuda` only), and `verify`
runs every probe: the plays of source distro on Debian 13 are the preflight, driver, cuda,
containers, rdma and microcode ones (no DCGM, fabric manager or nccl-tests there: the lock pins
none, and their probes skip saying so). Its cost is the `up`: the DKMS build of the driver's
module (about four and a half minutes with the driver's packages, on two cores at load 3.5) and
the CUDA 12.4 toolkit (about 2.5 GB installed: nvidia-cuda-dev alone is 2.4 GB); the first run
also fetches those packages into the package cache (over a gigabyte). Measured 2026-11-27 (three
plays, on the slower AMD machine): the `up` alone 11.4 minutes at load 3.5 with a cold package
cache. Measured 2026-12-01 (the whole site, the 2-core Xeon, warm package cache, nothing else
running): the `up` 5.9 minutes, `verify` 22 pass, 0 fail, 31 skip, and a second `provision --full`
changed 0 in 33 s. `provision --full --check` proves the site changes nothing on the converged
trixie node, the roles' molecule scenarios their idempotence.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, node_sh

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
MUST_PASS = ("os_supported", "dpkg_consistent", "driver_packages_match_the_lock", "gpu_packages_are_held",
             "dkms_module_for_every_kernel", "dkms_module_flavour_matches_the_lock", "nvcc_reports_the_locked_cuda",
             "nvcc_compiles_for_the_locked_architectures", "cuda_prefix_and_environment",
             "nccl_matches_the_lock", "docker_active", "docker_lists_the_nvidia_runtime",
             "container_toolkit_matches_the_lock", "rdma_userspace_present", "nccl_conf_has_the_expected_keys",
             "microcode_package_matches_the_pin", "microcode_loaded_early", "cudnn_matches_the_lock")


# The trixie node's bootstrap (its DKMS build and CUDA 12.4, about 13 minutes of two cores on the
# AMD EPYC of 2026-11-28 for three plays; 7.0 minutes for the file with the whole site on the
# 2-core Xeon of 2026-12-01, warm package cache) is opt-in since 2026-11-28: `make test` ran 84.7
# minutes of CI's 90 with it. GPUPROV_E2E_DEBIAN13=1 (`make test-debian13`) runs it; the refusals
# below run in `make test`.
FULL = os.environ.get("GPUPROV_E2E_DEBIAN13") == "1"
needs_node = pytest.mark.skipif(not FULL, reason=(
    "opt-in: GPUPROV_E2E_DEBIAN13=1 (`make test-debian13`), a Debian 13 node's whole site from scratch "
    "(the R550 DKMS build, CUDA 12.4, Docker), 7 to 13 minutes of two cores; last passed 2026-12-01 (5 passed, "
    "6.1 min)"))


@pytest.fixture(scope="module")
def trixie_image(env) -> str:
    """gpuprov/node:trixie, built by `make node-image-trixie` when missing or stale."""
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "node-image-trixie"], capture_output=True,
                          text=True, check=False, timeout=1200)
    assert proc.returncode == 0, f"make node-image-trixie failed: {proc.stderr[-2000:]}"
    return "gpuprov/node:trixie"


@pytest.fixture(scope="module")
def cluster(env, trixie_image):
    name = f"d13-{secrets.token_hex(3)}"
    try:
        proc = run_cli("up", "--provider", "docker", "--os", "debian13", "--source", "distro", "--count", "1",
                       "--name", name, "--health", "off", "-o", "json", "--yes",
                       env=env, timeout=2400)
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield name, json.loads(proc.stdout)
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def test_an_unknown_os_and_the_open_flavour_are_refused_before_anything_is_made(env) -> None:
    name = f"d13x-{secrets.token_hex(3)}"
    for args, words in ((["--os", "debian99"], "'debian99' is not one of"),
                        (["--os", "ubuntu22.04"], "--os ubuntu22.04: local nodes run debian12 or debian13"),
                        (["--os", "debian13", "--source", "distro", "--kernel-module", "open"],
                         "does not build against trixie's kernels")):
        proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--yes", *args, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    assert subprocess.run(["docker", "ps", "-aq", "--filter", f"label=gpuprov.cluster={name}"],
                          capture_output=True, text=True, check=True).stdout.strip() == ""
    assert not (Path(env["GPUPROV_HOME"]) / "clusters" / name).exists()


@needs_node
def test_up_locks_debian_13s_own_packages(cluster, env) -> None:
    name, data = cluster
    assert data["bootstrap"]["ok"] is True, data["bootstrap"]
    lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert (lock["os"], lock["source"], lock["driver"], lock["kernel_module"]) == (
        "debian13", "distro", "550.163.01", "proprietary")
    assert (lock["cuda"], lock["cuda_version"], lock["nccl"]) == ("12.4", "12.4.131", "2.22.3")
    packages = lock["packages"]
    assert packages["driver"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"]
    assert (packages["cuda"], packages["cuda_version"]) == ("nvidia-cuda-toolkit", "12.4.131~12.4.1-*")
    assert (packages["nccl"], packages["nccl_version"]) == (["libnccl2"], "2.22.3-1-1")


@needs_node
def test_the_node_runs_trixie_and_dkms_built_the_module_for_its_kernel(cluster) -> None:
    name, _ = cluster
    node = f"{name}-node-1"
    assert "VERSION_CODENAME=trixie" in node_sh(node, "cat /etc/os-release")
    status = node_sh(node, "dkms status")
    built = re.findall(r"^nvidia-current/550\.163\.01, (\S+), x86_64: installed$", status, re.M)
    assert built and all(k.endswith("+deb13-amd64") for k in built), status
    # The module file itself, as DKMS installed it for that kernel: its version is the lock's.
    version = node_sh(node, f"modinfo -F version $(find /lib/modules/{built[0]} -name 'nvidia-current.ko*' | head -n1)")
    assert version.strip() == "550.163.01", version
    assert "ii  nvidia-open-kernel-dkms" not in node_sh(node, "dpkg -l 'nvidia-open-kernel-dkms' 2>/dev/null")


@needs_node
def test_verify_passes_every_probe_with_no_failure(cluster, env) -> None:
    name, _ = cluster
    proc = run_cli("verify", name, env=env, timeout=600)
    print(proc.stdout)  # the verify table, for the record (pytest -s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert run["stack"]["os"] == "debian13"
    proc = run_cli("verify", name, "-o", "json", env=env, timeout=600)
    rows = {r["probe"]: r for r in next(iter(json.loads(proc.stdout)["hosts"].values()))}
    assert not [p for p, r in rows.items() if r["status"] == "fail"], rows
    for probe in MUST_PASS:
        assert rows[probe]["status"] == "pass", rows[probe]
    assert "nvidia-kernel-dkms 550.163.01-2" in rows["driver_packages_match_the_lock"]["detail"]
    assert "release 12.4, V12.4.131" in rows["nvcc_reports_the_locked_cuda"]["detail"]
    assert "sm_50, sm_90" in rows["nvcc_compiles_for_the_locked_architectures"]["detail"]
    assert "libnccl2 2.22.3-1-1, held; libnccl.so.2 loads and reports 22203" in rows["nccl_matches_the_lock"]["detail"]
    assert rows["docker_active"]["detail"].startswith("dockerd 26.1.5"), rows["docker_active"]
    assert rows["os_supported"]["detail"] == "debian 13 (trixie)"
    assert rows["microcode_package_matches_the_pin"]["detail"] in (
        "intel-microcode 3.20260925.1~deb13u1 (the lock's pin)", "amd64-microcode 3.20250311.1 (the lock's pin)")
    # cuDNN 9 for CUDA 12, from the artifact mirror's archive (rebuilt from NVIDIA's wheel).
    assert rows["cudnn_matches_the_lock"]["detail"] == "header 9.10.2, libcudnn.so.9 loads and reports 91002"
    # Debian 13's archive has no DCGM: its probes skip and say why.
    assert "(Debian 13's archive has none)" in rows["dcgm_matches_the_lock_and_is_held"]["detail"]


@needs_node
def test_check_of_the_site_changes_nothing_on_the_converged_node(cluster, env) -> None:
    name, _ = cluster
    proc = run_cli("provision", name, "--full", "--check", "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hosts = json.loads(proc.stdout)["hosts"]
    assert {h: (s["changed"], s["failed"]) for h, s in hosts.items()} == {f"{name}-node-1": (0, 0)}, hosts
