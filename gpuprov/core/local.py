"""`gpuprov verify --local`: the probes on this machine itself, with no cluster in gpuprov's
state and no SSH (a DGX administrator, a Slurm prolog, an image bake, a health check).

What the machine should have comes from the flags: ``--type`` (the catalog's GPU count and
model), or ``--gpus N [--gpu-model M]`` for an untyped host, or neither. The lock is resolved
the way a cluster's is (gpuprov.stack, as `gpuprov stack` and the static provider do): for
the type, or for the host as declared, completed by what its PCI bus shows (read here, as
the static provider reads a host's: catalog.from_hardware); ``--driver`` moves it to a
branch or release as `gpuprov stack --driver` does.

Without --type or --gpus no GPU count is expected: the count probe skips, saying what it
found. Taking the bus's own count as the expectation would pass that probe by comparing the
bus with itself, and so hide the failure a health check is there for: a GPU gone from the
bus. The other GPU probes still expect every GPU the bus shows to work (nvidia-smi, CUDA).

Nothing is written to gpuprov's state: a run's files (expectations, JSON lines, JUnit XML,
pytest's log) live in a temporary directory, removed afterwards, and kept (its log named in
the error) only when the probes could not run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuprov import catalog, stack
from gpuprov.core import Console
from gpuprov.core.results import ProbeRow, VerifyResult, VerifySummary
from gpuprov.errors import BadInput, GpuprovError

# The `cluster` of a local run's result (docs/json-output.md); its node is the hostname.
LOCAL = "local"


@dataclass(frozen=True)
class LocalRequest:
    """What `verify --local` was asked: checked by ``request`` before anything runs."""

    instance_type: str | None = None
    gpus: int | None = None
    gpu_model: str | None = None
    driver: str | None = None
    only: str | None = None


@dataclass(frozen=True)
class LocalPlan:
    """What the probes will expect of this machine, and the one line that says so."""

    node: str
    expectation: dict[str, Any]
    lock: dict[str, Any]
    expecting: str


def request(instance_type: str | None = None, gpus: int | None = None, gpu_model: str | None = None,
            driver: str | None = None, only: str | None = None) -> LocalRequest:
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
        from gpuprov.probes.run import check_groups

        only = check_groups(only)  # unknown group: one line, exit 2
    return LocalRequest(instance_type=instance_type or None, gpus=gpus, gpu_model=gpu_model or None,
                        driver=driver or None, only=only)


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
    lock = stack.resolve_types([kind], driver=req.driver, label=req.instance_type).as_dict()
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


def lock_line(lock: dict[str, Any]) -> str:
    return (f"lock {lock['hash']} ({lock.get('instance_type') or 'untyped'}): driver {lock['driver']} "
            f"({lock.get('kernel_module')} module, branch {lock.get('driver_branch')}), CUDA {lock['cuda']}"
            + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else ""))


def verify_local(req: LocalRequest, *, console: Console, level: str = "quick") -> tuple[VerifyResult, str]:
    """Run the probes here; the result (one node: this machine's hostname) and the run's JUnit
    XML (pytest's --junitxml)."""
    from gpuprov.probes.run import run_local_probes

    p = plan(req)
    if os.geteuid() != 0:
        console.say(f"verify --local: not running as root (uid {os.geteuid()}): probes that read "
                    "root-only files or ask systemd may fail; run it as root for the whole check")
    console.say(f"verify --local: {p.node}, expecting {p.expecting}"
                + (f"; probes: {req.only}" if req.only else ""))
    console.say(f"  {lock_line(p.lock)}")
    eol = stack.eol_warning(p.lock)
    if eol:
        console.say(f"gpuprov: warning: {eol}")
    run_dir = Path(tempfile.mkdtemp(prefix="gpuprov-verify-local-"))
    try:
        probed = run_local_probes({"*": {**p.expectation, "stack": p.lock}}, run_dir, level=level,
                                  console=console.rich, node=p.node, only=req.only)
    except GpuprovError:
        raise  # the message names the log in run_dir, which stays
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    junit_file = run_dir / "probes.xml"
    junit = junit_file.read_text() if junit_file.exists() else ""
    shutil.rmtree(run_dir, ignore_errors=True)
    rows = [ProbeRow.of(r) for r in probed.get(p.node, [])]
    counts = {s: sum(1 for r in rows if r.status == s) for s in ("pass", "fail", "skip")}
    summary = VerifySummary(pass_=counts["pass"], fail=counts["fail"], skip=counts["skip"])
    result = VerifyResult(cluster=LOCAL, ok=bool(rows) and counts["fail"] == 0, hosts={p.node: rows},
                          summary=summary)
    return result, junit
