"""The steps that take a node's GPUs from what nvidia-smi says they are to the sharing the lock
asks, in order: nothing where they match; else stop the GPU's clients, set the MIG mode and reset
the GPUs whose mode changes (or whose change waits for a reset), destroy the compute and GPU
instances that do not fit, create the layout's, and start the clients again.

The plan is the node program's: the gpu_sharing role installs and runs
``roles/gpu_sharing/files/gpu_sharing.py`` (standard library only, so the role needs nothing of
gpuprov), and this module loads that very file, so the plan gpuprov's tests check is the one the
nodes run (the client order and its source are in its docstring). A plan is data: each step's
command is a tuple of words made of the data files' profile names and GPU indexes, never of text
a user typed."""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Any

from gpuprov import paths
from gpuprov.sharing.choice import Sharing

NODE_PROGRAM = ("gpu_sharing", "files", "gpu_sharing.py")


@cache
def node_program() -> ModuleType:
    """The role's node program, loaded once from the roles directory gpuprov uses."""
    return paths.role_module("gpuprov_gpu_sharing_node", *NODE_PROGRAM)


def __getattr__(name: str) -> Any:
    """GpuState, Step, CLIENTS, DRIVER_CLIENTS: the node program's."""
    if name in ("GpuState", "Step", "CLIENTS", "DRIVER_CLIENTS"):
        return getattr(node_program(), name)
    raise AttributeError(name)


def plan(desired: Sharing, layout: dict[str, int] | None, gpus: list[Any],
         renamed: dict[str, str] | None = None) -> list[Any]:
    """The ordered steps (the node program's Step); [] when every GPU already matches. ``gpus``:
    GpuState (index, MIG mode with current and pending, instances, how many hold a compute
    instance); ``layout``: the instances per GPU of a MIG sharing (gpuprov.sharing.layouts);
    ``renamed``: {a driver's name: the data's name} of a profile (A100-80GB's 3g.39gb is 3g.40gb)."""
    return list(node_program().plan(desired.mode, desired.spelled(), layout, gpus, renamed))
