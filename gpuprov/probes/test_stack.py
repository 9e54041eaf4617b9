"""Probes for the GPU software stack: what the version lock pins is what the node has."""

from __future__ import annotations

import re
import shlex
from fnmatch import fnmatch

import pytest

from gpuprov.lock import cuda_lines
from gpuprov.lock.lock_data import LockData
from gpuprov.probes.nodefacts import (
    held_packages,
    in_container,
    installed_kernels,
    installed_version,
    nvidia_pci,
    require_systemd,
    unit_state,
)

GPU_PACKAGE_PATTERNS = "'nvidia-*' 'libnvidia-*' 'cuda-*' 'libcudnn*' 'nvidia-cuda-*' 'libcuda*'"


@pytest.mark.driver
def test_driver_packages_match_the_lock(host, expect, report):
    lock = expect.lock()
    pattern = lock["packages"]["driver_version"]
    found = {p: installed_version(host, p) for p in lock["packages"]["driver"]}
    wrong = {p: v for p, v in found.items() if v is None or not fnmatch(v, pattern)}
    assert not wrong, f"expected {sorted(found)} at {pattern} (driver {lock['driver']}), found {wrong}"
    report(f"{', '.join(f'{p} {v}' for p, v in found.items())}")


@pytest.mark.driver
def test_gpu_packages_are_held(host, expect, report):
    expect.lock()
    installed = host.run(
        f"dpkg-query -W -f='${{Status}}\\t${{Package}}\\n' {GPU_PACKAGE_PATTERNS} 2>/dev/null"
        " | awk -F'\\t' '$1 ~ / installed$/ { print $2 }'"
    ).stdout.split()
    held = held_packages(host)
    loose = sorted(set(installed) - held)
    assert installed, "expected NVIDIA packages installed, found none"
    assert not loose, f"expected every NVIDIA/CUDA package held, not held: {loose}"
    report(f"{len(installed)} NVIDIA/CUDA package(s) installed, all held")


@pytest.mark.driver
def test_nouveau_blacklisted(host, report):
    config = host.run("modprobe -c 2>/dev/null").stdout
    assert re.search(r"^blacklist nouveau$", config, re.M), (
        "expected nouveau blacklisted in modprobe's configuration, it is not"
    )
    if not in_container(host):
        assert not host.file("/sys/module/nouveau").exists, "nouveau is blacklisted but loaded"
    report("blacklist nouveau in modprobe.d" + ("" if in_container(host) else ", not loaded"))


@pytest.mark.dkms
def test_dkms_module_for_every_kernel(host, expect, report):
    lock = expect.lock()
    kernels = installed_kernels(host)
    assert kernels, "expected at least one kernel with headers for DKMS, found none"
    status = host.run("dkms status").stdout
    missing = [
        k
        for k in kernels
        if not re.search(
            rf"nvidia[^/]*/{re.escape(lock['driver'])}, {re.escape(k)}, [^:]*: installed", status
        )
    ]
    assert not missing, (
        f"expected the nvidia {lock['driver']} module built for {kernels}, missing for {missing}; "
        f"dkms status: {status.strip()[:300]}"
    )
    report(f"nvidia {lock['driver']} built for {', '.join(kernels)}")


@pytest.mark.fabricmanager
def test_fabric_manager_matches_driver(host, expect, report):
    lock = expect.lock()
    # The node's own PCI bus decides, not the lock: a lock resolved for the wrong type must
    # not turn an NVSwitch system's missing fabric manager into a skip.
    switches = nvidia_pci(host)["nvswitches"]
    kind = lock.get("instance_type") or expect.instance_type or "unknown"
    # In a mixed cluster the one lock carries fabric manager for its NVSwitch nodes: a node
    # declared without NVSwitch (expectation nvswitch false) needs none if its bus agrees.
    wanted = lock.get("fabricmanager") and expect.nvswitch is not False
    if not switches and not wanted:
        pytest.skip("no NVSwitch on this node's PCI bus: no fabric manager")
    if not lock.get("fabricmanager"):
        pytest.fail(
            f"expected a fabric manager in the lock: {switches} NVSwitch(es) on this node's PCI bus, "
            f"but the lock (resolved for {kind}) has no fabric manager (CUDA would fail with error 802)"
        )
    assert switches, (
        f"the lock (resolved for {kind}) expects NVSwitch and fabric manager {lock['fabricmanager']}, "
        "found no NVSwitch on this node's PCI bus: fabric manager cannot start; check the node's "
        "declared instance_type"
    )
    package = lock["packages"]["fabricmanager"]
    version = installed_version(host, package)
    assert version and version.startswith(lock["driver"] + "-"), (
        f"expected {package} {lock['driver']} (the driver's release), found {version}"
    )
    require_systemd(host)
    service = unit_state(host, "nvidia-fabricmanager")
    assert service.is_enabled, f"expected nvidia-fabricmanager enabled, found {service}"
    assert service.is_running, (
        f"expected nvidia-fabricmanager running ({switches} NVSwitch(es) present), found {service}")
    report(f"{package} {version}, enabled and running, {switches} NVSwitch(es)")


@pytest.mark.cuda
def test_nvcc_reports_the_locked_cuda(host, expect, report):
    lock = expect.lock()
    out = host.run("bash -lc 'nvcc --version'")
    assert out.rc == 0, f"expected nvcc on a login shell's PATH, found none ({out.stderr.strip()})"
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    assert match and match.group(1) == lock["cuda"], (
        f"expected nvcc release {lock['cuda']}, found {match.group(1) if match else out.stdout.strip()}"
    )
    report(out.stdout.strip().splitlines()[-2] if len(out.stdout.splitlines()) > 1 else out.stdout)


# A kernel and the runtime's headers: compiled by the node's nvcc for each architecture the
# lock names (the cluster's GPUs; for hosts of no known GPU, the oldest and newest its CUDA line
# drives), linked against the toolkit's runtime, and run: it prints the runtime version its
# headers declare (CUDART_VERSION). Running a kernel needs a GPU: cuda_context_can_be_created
# (test_gpu.py) proves that where there is one. (Asking the runtime itself without a driver
# answers 0 from CUDA 11.8 and 13000 from CUDA 13.0, seen here: not a check.)
PROGRAM = r"""#include <cstdio>
#include <cuda_runtime.h>
__global__ void scale(float *x, float a) { x[blockIdx.x * blockDim.x + threadIdx.x] *= a; }
int main() { std::printf("%d\n", CUDART_VERSION); return 0; }
"""


def compile_targets(lock: LockData) -> list[str]:
    archs = [a.strip() for a in (lock.get("arch") or "").split(",") if a.strip()]
    if archs:
        return archs
    line = cuda_lines.line(lock["cuda"])
    return sorted({line["arch_min"], line["arch_max"]}, key=cuda_lines.arch_number)


@pytest.mark.cuda
def test_nvcc_compiles_for_the_locked_architectures(host, expect, report):
    lock = expect.lock()
    targets = compile_targets(lock)
    flags = " ".join(f"-gencode arch=compute_{a[3:]},code={a}" for a in targets)
    script = (f"set -e; d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT; cd \"$d\"; "
              f"printf '%s' {shell_quote(PROGRAM)} > k.cu; nvcc {flags} -o k k.cu 2>&1; ./k")
    out = host.run(f"bash -lc {shell_quote(script)}")
    major, minor = (int(x) for x in lock["cuda"].split("."))
    want = str(major * 1000 + minor * 10)
    assert out.rc == 0 and out.stdout.strip().splitlines()[-1:] == [want], (
        f"expected a CUDA program to compile for {', '.join(targets)} against runtime headers {want}, "
        f"found: {(out.stdout + out.stderr).strip()[-400:]}")
    report(f"compiled for {', '.join(targets)} against runtime headers {want}; it runs")


def shell_quote(text: str) -> str:
    return shlex.quote(text)


@pytest.mark.cuda
def test_cuda_prefix_and_environment(host, expect, report):
    lock = expect.lock()
    out = host.run("test -L /usr/local/cuda && readlink -f /usr/local/cuda")
    target = out.stdout.strip() if out.rc == 0 else None
    assert target == f"/usr/local/cuda-{lock['cuda']}", (
        f"expected /usr/local/cuda -> /usr/local/cuda-{lock['cuda']}, found {target or 'no link'}"
    )
    env = host.run("bash -lc 'echo $PATH; echo $LD_LIBRARY_PATH'").stdout.splitlines()
    assert "/usr/local/cuda/bin" in env[0].split(":"), f"PATH lacks /usr/local/cuda/bin: {env[0]}"
    assert "/usr/local/cuda/lib64" in env[1].split(":"), f"LD_LIBRARY_PATH lacks lib64: {env[1]}"
    report(f"/usr/local/cuda -> {target}; PATH and LD_LIBRARY_PATH set for login shells")


@pytest.mark.cudnn
def test_cudnn_matches_the_lock(host, expect, report):
    lock = expect.lock()
    if (lock.get("packages") or {}).get("cudnn_method") == "tarball" and not lock.get("cudnn_archive"):
        pytest.skip(f"the lock pins no cuDNN archive for CUDA {lock['cuda']} (the artifact mirror serves "
                    f"none yet): cuDNN {lock['cudnn']} is not installed by gpuprov there")
    want = ".".join(lock["cudnn"].split(".")[:3])  # 8.9.6.50 -> 8.9.6
    major, minor, patch = (int(x) for x in want.split("."))
    library = f"libcudnn.so.{major}"
    # The CUDA prefix's (gpuprov's archives and tarballs), the system's, then NVIDIA's Debian and
    # Ubuntu packages' own name for the major (libcudnn9-headers-cuda-13: cudnn_version_v9.h in
    # the multiarch include directory, found on a real H200 whose header the v8 name missed).
    header = host.run(
        f"cat /usr/local/cuda-{lock['cuda']}/include/cudnn_version.h /usr/include/cudnn_version.h "
        f"/usr/include/x86_64-linux-gnu/cudnn_version_v{major}.h "
        f"/usr/include/aarch64-linux-gnu/cudnn_version_v{major}.h 2>/dev/null"
    ).stdout
    parts = [re.search(rf"#define CUDNN_{k}\s+(\d+)", header) for k in ("MAJOR", "MINOR", "PATCHLEVEL")]
    found = ".".join(m.group(1) for m in parts if m) if all(parts) else None
    assert found == want, f"expected cudnn_version.h to say {want}, found {found}"
    # The library itself: loaded by the dynamic linker, asked for its version.
    code = (
        f"import ctypes; lib = ctypes.CDLL('{library}'); "
        "lib.cudnnGetVersion.restype = ctypes.c_size_t; print(lib.cudnnGetVersion())"
    )
    out = host.run(f'python3 -c "{code}"')
    # cudnn_version.h: MAJOR*1000 + MINOR*100 + PATCH up to cuDNN 8, MAJOR*10000 + ... from 9.
    code_of = major * (10000 if major >= 9 else 1000) + minor * 100 + patch
    assert out.rc == 0 and out.stdout.strip() == str(code_of), (
        f"expected {library} to load and report {want}, found: {(out.stdout or out.stderr).strip()[:200]}"
    )
    report(f"header {found}, {library} loads and reports {out.stdout.strip()}")


# Package sources whose repositories carry NVIDIA's libnccl2 (the cuda role installs it there).
NCCL_SOURCES = ("nvidia", "mirror")


@pytest.mark.cuda
def test_nccl_matches_the_lock(host, expect, report):
    lock = expect.lock()
    packages = lock.get("packages") or {}
    if packages.get("cuda_method") == "archives":
        nccl_from_archive(host, lock, report)
        return
    if lock.get("source") == "distro" and packages.get("nccl"):
        nccl_from_distro(host, lock, report)
        return
    if lock.get("source") not in NCCL_SOURCES:
        pytest.skip(f"package source {lock.get('source')!r} carries no libnccl2 (Debian 12's archive has "
                    f"none): NCCL {lock['nccl']} is not installed by gpuprov there")
    want = f"{lock['nccl']}-1+cuda{lock['cuda']}"
    found = {p: installed_version(host, p) for p in ("libnccl2", "libnccl-dev")}
    wrong = {p: v for p, v in found.items() if v != want}
    assert not wrong, f"expected libnccl2 and libnccl-dev at {want} (NCCL {lock['nccl']}), found {wrong}"
    held = held_packages(host)
    assert "libnccl2" in held, "expected libnccl2 held (it moves only with the lock), it is not"
    report(f"libnccl2 and libnccl-dev {want}, held")


def nccl_loads(host, lock: LockData) -> str:
    """libnccl.so.2, loaded through the dynamic linker's paths, asked for its version
    (ncclGetVersion: MAJOR*10000 + MINOR*100 + PATCH from NCCL 2.9; it needs no GPU): the
    number, after an assertion that it is the lock's release."""
    major, minor, patch = (int(x) for x in lock["nccl"].split("."))
    code = ("import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); "
            "rc = lib.ncclGetVersion(ctypes.byref(v)); print(rc, v.value)")
    out = host.run(f'python3 -c "{code}"')
    want = f"0 {major * 10000 + minor * 100 + patch}"
    assert out.rc == 0 and out.stdout.strip() == want, (
        f"expected libnccl.so.2 to load and report {lock['nccl']} ({want}), "
        f"found: {(out.stdout or out.stderr).strip()[:200]}")
    return want.split()[1]


def nccl_from_distro(host, lock: LockData, report) -> None:
    """The distribution's own NCCL (Debian 13's libnccl2) at the lock's package version, held,
    and the library it installed loads and reports the locked release."""
    packages = lock["packages"]
    want = packages["nccl_version"]
    found = {p: installed_version(host, p) for p in packages["nccl"]}
    wrong = {p: v for p, v in found.items() if v != want}
    assert not wrong, f"expected {', '.join(found)} at {want} (NCCL {lock['nccl']}), found {wrong}"
    held = held_packages(host)
    loose = sorted(set(found) - held)
    assert not loose, f"expected {', '.join(found)} held (they move only with the lock), not held: {loose}"
    number = nccl_loads(host, lock)
    report(f"{', '.join(found)} {want}, held; libnccl.so.2 loads and reports {number}")


def nccl_from_archive(host, lock: LockData, report) -> None:
    """NCCL unpacked from the lock's archive: nccl.h says the locked release, and libnccl.so.2
    loads (through the dynamic linker's paths) and reports it (ncclGetVersion: MAJOR*10000 +
    MINOR*100 + PATCH from NCCL 2.9)."""
    header = host.run(f"cat /usr/local/cuda-{lock['cuda']}/include/nccl.h 2>/dev/null").stdout
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", header) for k in ("MAJOR", "MINOR", "PATCH")]
    found = ".".join(m.group(1) for m in parts if m) if all(parts) else None
    assert found == lock["nccl"], f"expected nccl.h to say {lock['nccl']}, found {found}"
    report(f"nccl.h {found}, libnccl.so.2 loads and reports {nccl_loads(host, lock)} (from the archive)")
