"""Probes for the GPUs themselves."""

from __future__ import annotations

import pytest

from gpuprov.probes.nodefacts import nvidia_pci


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


def test_nvidia_smi_sees_gpus(host, expect, report):
    if expect.gpus == 0:
        pytest.skip(expect.why_no_gpu())
    want = expect.gpus if expect.gpus is not None else nvidia_pci(host)["gpus"]
    if want == 0:
        pytest.skip(f"no NVIDIA GPU on the PCI bus of {expect.node}")
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
