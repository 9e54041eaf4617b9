"""slurm.conf, gres.conf, cgroup.conf and the task environment of a cluster: a thin, typed door
onto the slurm role's filter plugin (roles/slurm/filter_plugins/gpuprov_slurm.py).

The rules live in that one file, standard library only, so the role renders the same files
from its own variables and facts without gpuprov; this module loads it from the roles gpuprov
ships and turns its refusals into ``BadInput`` (one line, exit 2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput

PLUGIN = ("slurm", "filter_plugins", "gpuprov_slurm.py")


@cache
def rules() -> ModuleType:
    """The role's filter plugin, loaded once from the roles directory gpuprov uses."""
    return paths.role_module("gpuprov_slurm_rules", *PLUGIN)


@dataclass(frozen=True)
class SlurmNode:
    """One compute node as slurm.conf describes it: its facts and its GPU census."""

    name: str
    cpus: int
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    memtotal_mb: int
    gpus: int = 0
    gpu_model: str = ""
    nvml: bool = False
    partition: str = ""
    addr: str = ""


@dataclass(frozen=True)
class SlurmPower:
    """Slurm's power saving for dynamic nodes: the idle time before a node is powered down, the
    time allowed each way, the programs slurmctld runs (a hostlist argument) and the release
    its version-dependent lines follow (roles/slurm/filter_plugins/gpuprov_slurm.py power_lines)."""

    suspend_time: int
    resume_program: str
    suspend_program: str
    resume_fail_program: str
    slurm_version: str
    suspend_timeout: int = 120
    resume_timeout: int = 600


@dataclass(frozen=True)
class SlurmCluster:
    cluster_name: str
    controller: str
    nodes: tuple[SlurmNode, ...]
    controller_addr: str = ""
    default_partition: str = "all"
    task_prolog: str = ""
    health_check_program: str = ""
    health_check_interval: int = 300
    dynamic_nodes: tuple[SlurmNode, ...] = ()
    power: SlurmPower | None = None
    # The lock's GPU sharing (mig:LAYOUT, shard:N, mps, none) and a MIG layout's instances per GPU.
    gpu_sharing: str = "none"
    gpu_sharing_instances: Mapping[str, int] | None = None
    # Accounting: slurmdbd's host (its address, else its name; "" for no accounting) and the
    # fairshare weight of the multifactor priority.
    accounting_host: str = ""
    fairshare_weight: int = 10000

    def description(self) -> dict[str, Any]:
        """The mapping the role's filters take."""
        return {
            "cluster_name": self.cluster_name, "controller": self.controller,
            "controller_addr": self.controller_addr, "default_partition": self.default_partition,
            "task_prolog": self.task_prolog, "health_check_program": self.health_check_program,
            "health_check_interval": self.health_check_interval,
            "nodes": [vars(n) for n in self.nodes],
            "dynamic_nodes": [vars(n) for n in self.dynamic_nodes],
            "power": vars(self.power) if self.power else {},
            "gpu_sharing": {"sharing": self.gpu_sharing, "instances": dict(self.gpu_sharing_instances or {})},
            "accounting": ({"host": self.accounting_host, "fairshare_weight": self.fairshare_weight}
                           if self.accounting_host else {}),
        }


def call_rule(module: ModuleType, error: type[Exception], name: str, *args: Any) -> Any:
    """A rule of a role's filter plugin, its refusal (``error``) made BadInput: one line, exit 2."""
    try:
        return getattr(module, name)(*args)
    except error as exc:
        raise BadInput(f"slurm: {exc}") from None


def _call(name: str, *args: Any) -> Any:
    return call_rule(rules(), rules().SlurmConfError, name, *args)


def _description(cluster: SlurmCluster | Mapping[str, Any]) -> Mapping[str, Any]:
    return cluster.description() if isinstance(cluster, SlurmCluster) else cluster


def slurm_conf(cluster: SlurmCluster | Mapping[str, Any]) -> str:
    return _call("slurm_conf", _description(cluster))


def gres_conf(cluster: SlurmCluster | Mapping[str, Any]) -> str:
    return _call("gres_conf", _description(cluster))


def cgroup_conf() -> str:
    return _call("cgroup_conf")


def task_env(env: Mapping[str, Any]) -> str:
    """The ``export NAME=value`` lines every task gets (the role's TaskProlog prints them)."""
    return _call("task_env", env)


def hosts_entries(cluster: SlurmCluster | Mapping[str, Any]) -> str:
    """The ``address name`` lines of /etc/hosts by which every node resolves the others."""
    return _call("hosts_entries", _description(cluster))


def tcp_interface(facts: Mapping[str, Any], addr: str = "") -> str:
    """The interface holding a node's Slurm address: Open MPI's TCP traffic is kept there."""
    return _call("tcp_interface", facts, addr)


def apt_version(apt_show: str, package: str) -> str:
    """The Version of ``package`` in `apt-cache show` output ('' where it has none)."""
    return _call("apt_version", apt_show, package)


def slurm_version(text: str) -> tuple[int, int]:
    """(major, minor) of a Slurm release as `sinfo --version` or a package version gives it."""
    return _call("slurm_version", text)


def real_memory(memtotal_mb: int, gpus: int = 0) -> int:
    return _call("real_memory", memtotal_mb, gpus)


def gres_type(model: str | None) -> str:
    return _call("gres_type", model)


def check(cluster: SlurmCluster | Mapping[str, Any]) -> dict[str, Any]:
    """The description checked and completed (RealMemory, GRES type, partition per node)."""
    return _call("cluster", _description(cluster))
