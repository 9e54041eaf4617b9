"""The steps that take a node's GPUs from what nvidia-smi says they are to the sharing the lock
asks, in order: nothing where they match; else stop the GPU's clients, set the MIG mode and reset
the GPUs whose mode changes (or whose change waits for a reset), destroy the compute and GPU
instances that do not fit, create the layout's, and start the clients again.

The clients, in the order they are stopped (started again in the reverse order), after NVIDIA
mig-parted's hooks (deployments/systemd/hooks-default.yaml: services stopped before a mode change
and before a new layout, "driver services" too before a mode change, all started at the end):
slurmd first (no job lands on a GPU being changed), the Kubernetes device plugin where one runs,
dcgm-exporter and DCGM (each holds the GPU through NVML); then, only where a GPU is reset, the
driver's own clients: fabric manager (NVSwitch systems) and the persistence daemon, which keeps
the driver's handle open. A reset needs a GPU without any client.

A plan is data: each step's command is a tuple of words made of the data files' profile names
and GPU indexes, never of text a user typed. Nothing here runs a command (the role that applies a
plan on the nodes is still to come: docs/gpu-sharing.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpuprov.sharing.choice import Sharing
from gpuprov.sharing.smi import MigMode

CLIENTS = ("slurmd", "nvidia-device-plugin", "dcgm-exporter", "nvidia-dcgm")
DRIVER_CLIENTS = ("nvidia-fabricmanager", "nvidia-persistenced")


@dataclass(frozen=True)
class GpuState:
    """One GPU as a node's nvidia-smi reports it."""

    index: int
    mode: MigMode
    # {profile name: GPU instances} (mig -lgi), the names as the driver reports them.
    instances: Counter[str] = field(default_factory=Counter)
    # GPU instances that hold a compute instance (mig -lci).
    with_compute: int = 0


@dataclass(frozen=True)
class Step:
    what: str  # stop, set-mode, reset, destroy, create, start
    gpu: int | None  # None: a service of the node
    command: tuple[str, ...]
    why: str


def plan(desired: Sharing, layout: dict[str, int] | None, gpus: list[GpuState],
         renamed: dict[str, str] | None = None) -> list[Step]:
    """The ordered steps; [] when every GPU already matches. ``layout``: the instances per GPU of a
    MIG sharing (gpuprov.sharing.layouts.layout_of); ``renamed``: {a driver's name: the data's
    name} of a profile (A100-80GB's 3g.39gb is 3g.40gb)."""
    body: list[Step] = []
    reset = False
    for gpu in gpus:
        steps = _gpu_steps(desired, layout or {}, gpu, renamed or {})
        reset = reset or any(s.what == "reset" for s in steps)
        body += steps
    if not body:
        return []
    clients = CLIENTS + (DRIVER_CLIENTS if reset else ())
    stop = [Step("stop", None, ("systemctl", "stop", name), "a client of the GPUs") for name in clients]
    start = [Step("start", None, ("systemctl", "start", name), "the GPUs are ready") for name in reversed(clients)]
    return stop + body + start


def _gpu_steps(desired: Sharing, layout: dict[str, int], gpu: GpuState, renamed: dict[str, str]) -> list[Step]:
    if gpu.mode.current == "N/A":  # a GPU without MIG: MPS and shards ask nothing of it here
        return []
    want = "Enabled" if desired.mode == "mig" else "Disabled"
    i = str(gpu.index)
    have = Counter({renamed.get(name, name): n for name, n in gpu.instances.items()})
    fits = have == Counter(layout) and gpu.with_compute == sum(have.values())
    steps = []
    if gpu.mode.current == "Enabled" and have and (want == "Disabled" or not fits):
        steps += [Step("destroy", gpu.index, ("nvidia-smi", "mig", "-i", i, "-dci"), "compute instances"),
                  Step("destroy", gpu.index, ("nvidia-smi", "mig", "-i", i, "-dgi"), "GPU instances")]
    if gpu.mode.pending != want:
        steps.append(Step("set-mode", gpu.index, ("nvidia-smi", "-i", i, "-mig", "1" if want == "Enabled" else "0"),
                          f"MIG mode {gpu.mode.pending.lower()} -> {want.lower()}"))
    if gpu.mode.current != want:
        why = "the MIG mode change waits for it" if gpu.mode.pending == want else "to change the MIG mode"
        steps.append(Step("reset", gpu.index, ("nvidia-smi", "--gpu-reset", "-i", i), why))
    if want == "Enabled" and (gpu.mode.current != want or not fits):
        names = ",".join(name for name, n in layout.items() for _ in range(n))
        steps.append(Step("create", gpu.index, ("nvidia-smi", "mig", "-i", i, "-cgi", names, "-C"),
                          f"{desired.spelled()}: GPU instances and their compute instances"))
    return steps
