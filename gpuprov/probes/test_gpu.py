"""Probes for the GPUs themselves."""

from __future__ import annotations

import pytest

from gpuprov.probes.nodefacts import nvidia_pci

pytestmark = pytest.mark.gpu


def test_gpus_on_pci_bus(host, expect, report):
    found = nvidia_pci(host)["gpus"]
    if expect.gpus is None:
        pytest.skip(
            f"no expected GPU count for {expect.node} (found {found}); "
            "give instance_type or gpus for it in the hosts file"
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
    assert out.rc == 0 and out.stdout.startswith("[0, 0, 0, 0]"), (
        f"expected a CUDA context on GPU 0 (all CUresult 0), found: {(out.stdout or out.stderr).strip()[:200]}"
    )
    count = int(out.stdout.split()[-1])
    assert count == want, f"expected the CUDA driver to see {want} device(s), it sees {count}"
    report(f"CUDA context created on GPU 0; the CUDA driver sees {count} device(s)")
