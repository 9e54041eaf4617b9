"""This machine, for `verify --local` (gpuprov.core.local) and `health --local`
(gpuprov.health.run): the request checked, its PCI bus read, what it should have and its lock.

What the machine should have comes from the flags: ``--type`` (the catalog's GPU count and
model), or ``--gpus N [--gpu-model M]`` for an untyped host, or neither. The lock is resolved
the way a cluster's is (gpuprov.lock.stack, as `gpuprov stack` and the static provider do): for
the type, or for the host as declared, completed by what its PCI bus shows (read here, as
the static provider reads a host's: catalog.from_hardware); ``--driver`` moves it to a
branch or release as `gpuprov stack --driver` does.

Without --type or --gpus no GPU count is expected: the count probe skips, saying what it
found. Taking the bus's own count as the expectation would pass that probe by comparing the
bus with itself, and so hide the failure a health check is there for: a GPU gone from the
bus. The other GPU probes still expect every GPU the bus shows to work (nvidia-smi, CUDA).
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass, replace
from typing import Any

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.lock import stack
from gpuprov.lock.lock_data import LockData
from gpuprov.probes.run import check_groups

# The `cluster` of a local run's result (docs/json-output.md); its node is the hostname.
LOCAL = "local"


@dataclass(frozen=True)
class LocalRequest:
    """What `verify --local` was asked: checked by ``request`` before anything runs."""

    instance_type: str | None = None
    gpus: int | None = None
    gpu_model: str | None = None
    driver: str | None = None
    cuda: str | None = None
    only: str | None = None


@dataclass(frozen=True)
class LocalPlan:
    """What the probes will expect of this machine, and the one line that says so."""

    node: str
    expectation: dict[str, Any]
    lock: LockData
    expecting: str


def request(instance_type: str | None = None, gpus: int | None = None, gpu_model: str | None = None,
            driver: str | None = None, only: str | None = None, cuda: str | None = None) -> LocalRequest:
    """The request, checked (BadInput: one line, exit 2) and the GPU model spelt as the catalog
    spells it."""
    if instance_type and (gpus is not None or gpu_model):
        raise BadInput("--type and --gpus/--gpu-model exclude each other: the type says how many "
                       "GPUs of which model")
    if gpus is not None and gpus < 0:
        raise BadInput(f"--gpus {gpus}: a GPU count is 0 or more")
    if gpu_model and gpus is None:
        raise BadInput(f"--gpu-model {gpu_model} needs --gpus N: how many of them this machine has")
    if gpu_model and gpus == 0:
        raise BadInput(f"--gpu-model {gpu_model} with --gpus 0: a machine without GPU has no GPU model")
    if instance_type:
        catalog.get(instance_type)  # unknown: did-you-mean, exit 2
    if gpu_model:
        known = {t.gpu_model.lower(): t.gpu_model for t in catalog.all_types() if t.gpu_model}
        if gpu_model.lower() not in known:
            raise BadInput(f"unknown GPU model '{gpu_model}'; known GPUs: {', '.join(sorted(known.values()))}")
        gpu_model = known[gpu_model.lower()]
    if only is not None:
        only = check_groups(only)  # unknown group: one line, exit 2
    return LocalRequest(instance_type=instance_type or None, gpus=gpus, gpu_model=gpu_model or None,
                        driver=driver or None, cuda=cuda or None, only=only)


def read_pci_bus() -> dict[str, Any]:
    """This machine's NVIDIA GPUs and NVSwitches, read from sysfs the way a static host's
    are read over SSH (catalog.PCI_READ, catalog.parse_pci)."""
    out = subprocess.run(["sh", "-c", catalog.PCI_READ], capture_output=True, text=True, check=False)
    return catalog.parse_pci(out.stdout)


def plan(req: LocalRequest, bus: dict[str, Any] | None = None) -> LocalPlan:
    """The expectation and lock for this machine (``bus``: its PCI bus, read when not given)."""
    bus = read_pci_bus() if bus is None else bus
    declared = catalog.get(req.instance_type) if req.instance_type else None
    kind = catalog.from_hardware(bus, declared, gpus=req.gpus)
    if req.gpu_model:
        kind = replace(kind, gpu_model=req.gpu_model, arch=catalog.ARCH_BY_GPU.get(req.gpu_model))
    lock = stack.resolve_types([kind], cuda=req.cuda, driver=req.driver, label=req.instance_type).as_dict()
    on_bus = len(bus.get("gpu_device_ids") or [])
    expect: dict[str, Any] = {"instance_type": req.instance_type, "gpus": req.gpus,
                              "gpu_model": req.gpu_model, "nvswitch": kind.nvswitch}
    if declared is not None:
        expect |= {"gpus": declared.gpu_count, "gpu_model": declared.gpu_model,
                   "virtualization": declared.virtualization}
        gpus = f"{declared.gpu_count} x {declared.gpu_model}" if declared.gpu_count else "no GPU"
        expecting = f"{declared.name} (catalog): {gpus}"
    elif req.gpus is not None:
        expecting = (f"{req.gpus} x {req.gpu_model or 'NVIDIA GPU'} (--gpus"
                     + (", --gpu-model)" if req.gpu_model else ")"))
    else:
        expecting = (f"no GPU count (neither --type nor --gpus given): the GPU count probe skips; "
                     f"the other GPU probes expect the {on_bus} GPU(s) the PCI bus shows to work")
    return LocalPlan(node=socket.gethostname() or LOCAL, expectation=expect, lock=lock, expecting=expecting)


def lock_line(lock: LockData) -> str:
    return (f"lock {lock['hash']} ({lock.get('instance_type') or 'untyped'}): driver {lock['driver']} "
            f"({lock.get('kernel_module')} module, branch {lock.get('driver_branch')}), CUDA {lock['cuda']}"
            + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else ""))
