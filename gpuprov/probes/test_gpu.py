"""Probes for the GPUs themselves, and for the kernel module flavour the node runs."""

from __future__ import annotations

import re

import pytest

from gpuprov.lock.lock_data import LockData
from gpuprov.probes.nodefacts import installed_kernels, nvidia_pci, read_text

pytestmark = pytest.mark.gpu

# /proc/driver/nvidia/version's first line names the flavour: "NVRM version: NVIDIA UNIX
# Open Kernel Module for x86_64  580.159.04  Release Build ..." (the open modules, as the
# real H100 in tests/fixtures/recordings/h100-sxm5-580/proc-driver.txt prints it) or
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01  <build date>" (proprietary).
_NVRM = re.compile(r"NVRM version: NVIDIA UNIX (?:(Open) Kernel Module for \S+|\S+ Kernel Module)"
                   r"\s+(\d+(?:\.\d+)+)")
# modinfo's license field of the built nvidia module: the open modules are "Dual MIT/GPL"
# (NVIDIA/open-gpu-kernel-modules), the proprietary ones "NVIDIA".
_LICENSES = {"Dual MIT/GPL": "open", "NVIDIA": "proprietary"}


def parse_nvrm_version(text: str) -> dict[str, str] | None:
    """{"kernel_module": "open"|"proprietary", "driver": "580.159.04"} from the text of
    /proc/driver/nvidia/version; None when it names no NVIDIA kernel module."""
    match = _NVRM.search(text)
    if match is None:
        return None
    return {"kernel_module": "open" if match.group(1) else "proprietary", "driver": match.group(2)}


def flavour_of_license(license_field: str) -> str | None:
    """The kernel module flavour a module's license field (modinfo -F license) means."""
    return _LICENSES.get(license_field.strip())


def test_gpus_on_pci_bus(host, expect, report):
    found = nvidia_pci(host)["gpus"]
    if expect.gpus is None:
        pytest.skip(
            f"no expected GPU count for {expect.node} (found {found}); "
            "give instance_type or gpus for it in the hosts file (verify --local: --type or --gpus)"
        )
    assert found == expect.gpus, (
        f"expected {expect.gpus} NVIDIA GPU(s) on the PCI bus "
        f"({expect.instance_type or 'configured'}), found {found}"
    )
    report(f"{found} NVIDIA GPU(s) on the PCI bus, as expected")


def _gpus_expected(host, expect) -> int:
    """How many GPUs the node must show; skips (with the reason) where it can have none."""
    if expect.gpus == 0:
        pytest.skip(expect.why_no_gpu())
    want = expect.gpus if expect.gpus is not None else nvidia_pci(host)["gpus"]
    if want == 0:
        pytest.skip(f"no NVIDIA GPU on the PCI bus of {expect.node}")
    return want


def test_nvidia_smi_sees_gpus(host, expect, report):
    want = _gpus_expected(host, expect)
    assert host.exists("nvidia-smi"), (
        f"expected nvidia-smi to list {want} GPU(s), found no nvidia-smi (driver not installed)"
    )
    out = host.run("nvidia-smi -L")
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    assert out.rc == 0 and len(gpus) == want, (
        f"expected nvidia-smi to list {want} GPU(s), found {len(gpus)}: "
        f"{(out.stdout or out.stderr).strip()[:300]}"
    )
    report(f"nvidia-smi lists {len(gpus)} GPU(s): {gpus[0] if gpus else ''}")


def test_driver_version_persistence_and_model(host, expect, report):
    want = _gpus_expected(host, expect)
    lock = expect.lock()
    out = host.run("nvidia-smi --query-gpu=driver_version,persistence_mode,name --format=csv,noheader")
    assert out.rc == 0, f"nvidia-smi failed: {(out.stderr or out.stdout).strip()[:200]}"
    rows = [[c.strip() for c in line.split(",")] for line in out.stdout.strip().splitlines()]
    assert len(rows) == want, f"expected {want} GPU(s), nvidia-smi lists {len(rows)}"
    drivers = {r[0] for r in rows}
    assert drivers == {lock["driver"]}, f"expected driver {lock['driver']}, found {sorted(drivers)}"
    off = [i for i, r in enumerate(rows) if r[1] != "Enabled"]
    assert not off, f"expected persistence mode on every GPU, off on GPU(s) {off}"
    if expect.gpu_model:
        odd = sorted({r[2] for r in rows if expect.gpu_model not in r[2]})
        assert not odd, f"expected {expect.gpu_model} GPUs, found {odd}"
    report(f"{want} x {rows[0][2]}, driver {lock['driver']}, persistence on")


def test_cuda_context_can_be_created(host, expect, report):
    want = _gpus_expected(host, expect)
    code = (
        "import ctypes; c = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(); d = ctypes.c_int(); "
        "x = ctypes.c_void_p(); "
        "r = [c.cuInit(0), c.cuDeviceGetCount(ctypes.byref(n)), c.cuDeviceGet(ctypes.byref(d), 0), "
        "c.cuCtxCreate_v2(ctypes.byref(x), 0, d)]; c.cuCtxDestroy_v2(x); print(r, n.value)"
    )
    out = host.run(f'python3 -c "{code}"')
    # A failed import or call ends its traceback with the cause (libcuda.so.1 missing, ...).
    found = out.stdout.strip() if out.rc == 0 else (out.stderr.strip().splitlines() or [out.stdout.strip()])[-1]
    assert out.rc == 0 and out.stdout.startswith("[0, 0, 0, 0]"), (
        f"expected a CUDA context on GPU 0 (all CUresult 0), found: {found[:200]}"
    )
    count = int(out.stdout.split()[-1])
    assert count == want, f"expected the CUDA driver to see {want} device(s), it sees {count}"
    report(f"CUDA context created on GPU 0; the CUDA driver sees {count} device(s)")


def _lock_flavour(lock: LockData) -> str:
    # Locks stored before the kernel_module field installed the proprietary modules.
    return lock.get("kernel_module") or "proprietary"


def test_running_kernel_module_flavour_matches_the_lock(host, expect, report):
    _gpus_expected(host, expect)
    lock = expect.lock()
    version = read_text(host, "/proc/driver/nvidia/version")
    assert version is not None, (
        f"expected the NVIDIA kernel module ({_lock_flavour(lock)}, {lock['driver']}) loaded, "
        "found no /proc/driver/nvidia/version (no NVIDIA module loaded)"
    )
    seen = parse_nvrm_version(version)
    assert seen is not None, (
        f"expected /proc/driver/nvidia/version to name the NVIDIA kernel module, found: "
        f"{version.strip()[:200]}"
    )
    want = {"kernel_module": _lock_flavour(lock), "driver": lock["driver"]}
    assert seen == want, (
        f"expected the {want['kernel_module']} kernel module {want['driver']} running, found the "
        f"{seen['kernel_module']} module {seen['driver']} (/proc/driver/nvidia/version)"
    )
    report(f"{seen['kernel_module']} kernel module {seen['driver']} loaded")


@pytest.mark.dkms
def test_dkms_module_flavour_matches_the_lock(host, expect, report):
    lock = expect.lock()
    want = _lock_flavour(lock)
    kernels = installed_kernels(host)
    assert kernels, "expected at least one kernel with headers for DKMS, found none"
    found: dict[str, str | None] = {}
    for kernel in kernels:
        # Debian's packages build the module as nvidia-current, NVIDIA's as nvidia.
        out = host.run(f"modinfo -k {kernel} -F license nvidia 2>/dev/null || "
                       f"modinfo -k {kernel} -F license nvidia-current 2>/dev/null")
        found[kernel] = flavour_of_license(out.stdout) if out.rc == 0 else None
    missing = sorted(k for k, v in found.items() if v is None)
    assert not missing, f"expected the {want} nvidia module built for {kernels}, none for {missing}"
    wrong = {k: v for k, v in found.items() if v != want}
    assert not wrong, f"expected the {want} kernel module built (lock), found {wrong}"
    report(f"{want} nvidia module built for {', '.join(kernels)}")
