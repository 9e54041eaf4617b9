"""The slurm role's configuration files, from a cluster description: the one copy of the rules.

The role's templates call these filters on a description it builds from its own variables and
each node's facts, so the role needs nothing but ansible-core; gpuprov's ``gpuprov.slurm.conf``
loads this very file, so the rules its tests check are the ones the role writes. Standard
library only.

A cluster description (a mapping)::

    {"cluster_name": "train", "controller": "train-1", "controller_addr": "10.0.0.5",
     "default_partition": "all", "task_prolog": "", "health_check_program": "",
     "health_check_interval": 300,
     "nodes": [{"name": "train-1", "addr": "10.0.0.5", "cpus": 96, "sockets": 2,
                "cores_per_socket": 24, "threads_per_core": 2, "memtotal_mb": 1160000,
                "gpus": 8, "gpu_model": "A100", "nvml": false, "partition": "p4d.24xlarge"}]}

GPU sharing (``gpu_sharing``, the cluster's one, on every GPU node; absent or ``{"sharing":
"none"}``: whole GPUs)::

    "gpu_sharing": {"sharing": "mig:all-balanced",
                    "instances": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}   # per GPU
    "gpu_sharing": {"sharing": "shard:4"}      # gres/shard, 4 per GPU
    "gpu_sharing": {"sharing": "mps"}          # gres/mps, 100 per GPU

Dynamic nodes (``dynamic_nodes``: entries of the same shape, without ``addr``) are declared
``State=CLOUD``: Slurm powers them up when jobs need them and down after ``power``'s
``suspend_time`` idle seconds, through the programs ``power`` names (see ``power_lines``)::

    "dynamic_nodes": [{"name": "train-dy-1", "cpus": 96, ...}],
    "power": {"suspend_time": 600, "suspend_timeout": 120, "resume_timeout": 600,
              "resume_program": "/usr/local/sbin/resume", "suspend_program": "/usr/local/sbin/suspend",
              "resume_fail_program": "/usr/local/sbin/resume-failed", "slurm_version": "22.05.8"}

Accounting (``accounting``: absent or ``{}`` for none): slurmdbd on ``host`` (its address, or
its name where it has none), fairshare weighed by ``fairshare_weight`` (see
``accounting_lines``)::

    "accounting": {"host": "10.0.0.5", "fairshare_weight": 10000}

Every name and value is checked before a line is written: a value that could end a line, start
a comment or add a parameter (newline, ``#``, ``=``, space, comma where Slurm splits on it) is
refused with ``SlurmConfError`` naming it, never escaped or dropped.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any

# --- Memory kept from Slurm (RealMemory = MemTotal - reserve) -------------------------------
# For the OS (systemd, sshd, munge, slurmd and its step daemons, the page cache a node needs to
# stay responsive): 5 % of MemTotal, at least 1 GiB. 5 % is what AWS ParallelCluster keeps
# (its RealMemory is 95 % of the instance's memory); the floor keeps small nodes usable.
OS_RESERVE_PERCENT = 5
OS_RESERVE_MIN_MB = 1024
# For the NVIDIA driver, per GPU: the kernel driver's and the persistence daemon's host-side
# state and the pinned staging buffers NCCL and CUDA allocate outside a job's cgroup accounting.
# A margin chosen, not measured: 512 MiB per GPU (4 GiB on an 8-GPU node).
DRIVER_RESERVE_PER_GPU_MB = 512

# Slurm's node names are host names (slurmd finds its own line by `hostname -s`): letters,
# digits, '-' and '_', starting with a letter or digit, at most 63 characters. Brackets and
# commas are Slurm's hostlist syntax, '=' and whitespace its parameter syntax, '#' a comment.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# ClusterName: Slurm lower-cases it; the accounting database names tables after it.
_CLUSTER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
# Partition names: instance types (p4d.24xlarge) and labels.
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A GRES type: the GPU model lower-cased (a100, h100, a10g, l40s).
_GRES_TYPE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
# A GPU sharing as the lock records it (gpuprov.sharing.choice) and a MIG profile, the GRES type
# of its instances (1g.10gb; the media-engine profiles, 1g.10gb+me, are no GRES type: refused).
_SHARING = re.compile(r"none|mps|shard:[0-9]{1,2}|mig:[a-z0-9][a-z0-9.+-]{0,39}")
_MIG_PROFILE = re.compile(r"[1-8]g\.[0-9]{1,3}gb")
_MAX_SHARDS = 64  # gpuprov.defaults.MAX_GPU_SHARDS
MPS_PER_GPU = 100  # Slurm's gres/mps counts a GPU as 100 (its share of the GPU's SMs, in percent)
# A program path Slurm runs: absolute, no whitespace or shell-significant characters.
_PATH = re.compile(r"/[A-Za-z0-9._/+-]{1,255}")
# Environment variable names a task may be given.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# An IPv6 zone id (fe80::1%eth0): an interface name or number.
_ZONE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# What ends a line for some reader: C0 controls, DEL, C1 controls, Unicode's line separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# The most GPUs one node line may claim, and a sane ceiling for CPU counts.
_MAX_GPUS = 64
_MAX_CPUS = 16384

STATE_SAVE = "/var/lib/slurm/slurmctld"
SLURMD_SPOOL = "/var/lib/slurm/slurmd"


class SlurmConfError(ValueError):
    """A cluster description the configuration cannot express safely."""


def _text(value: Any, what: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise SlurmConfError(f"{what} {value!r}: expected {_describe(pattern)}")
    return value


def _describe(pattern: re.Pattern[str]) -> str:
    return {
        _NODE_NAME: "a host name (letters, digits, '-', '_'; at most 63 characters)",
        _HOST_NAME: "an IP address or a DNS name",
        _CLUSTER_NAME: "lower-case letters, digits, '-', '_' (at most 40 characters)",
        _PARTITION: "letters, digits, '.', '-', '_' (at most 64 characters)",
        _GRES_TYPE: "letters, digits, '.', '-', '_' (at most 32 characters)",
        _SHARING: "mig:LAYOUT, mps, shard:N or none",
        _MIG_PROFILE: "a MIG profile such as 1g.10gb (a +me profile is no Slurm GRES type)",
        _PATH: "an absolute path of letters, digits and . / + - _",
        _ENV_NAME: "an environment variable name (letters, digits, '_')",
        _IFACE: "an interface name (letters, digits, '_', '.', '-'; at most 15 characters)",
    }[pattern]


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise SlurmConfError(f"{what} {value!r}: expected a whole number")
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value):
        value = int(value)
    if not isinstance(value, int) or not low <= value <= high:
        raise SlurmConfError(f"{what} {value!r}: expected a whole number from {low} to {high}")
    return value


def _addr(value: Any, what: str) -> str:
    if value in (None, ""):
        return ""
    if isinstance(value, str):
        # ipaddress takes anything after an IPv6 '%' but '/' and '%': a newline, '=', '#'.
        _, percent, zone = value.partition("%")
        if percent and not _ZONE_ID.fullmatch(zone):
            raise SlurmConfError(f"{what} {value!r}: an IPv6 zone id is an interface name "
                                 "(letters, digits, '_', '.', '-')")
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    return _text(value, what, _HOST_NAME)


def _lines(text: str, what: str) -> str:
    """The last word on a file this module writes, whatever checked its values before: no line
    holds a control character (a carriage return, NUL, a vertical tab...), so each line written
    is one line for every reader. (The same rule as gpuprov.validate.one_line: this role stands
    alone, standard library only, so it keeps its own copy.)"""
    for number, line in enumerate(text.split("\n"), start=1):
        if _CONTROL.search(line):
            raise SlurmConfError(f"{what}: line {number} holds a control character: {line[:80]!r}")
    return text


def real_memory(memtotal_mb: int, gpus: int = 0) -> int:
    """RealMemory in MiB: MemTotal less the OS reserve (5 %, at least 1 GiB) and the driver's
    (512 MiB per GPU); at least 1."""
    memtotal_mb = _int(memtotal_mb, "memtotal_mb", 1, 1 << 40)
    gpus = _int(gpus, "gpus", 0, _MAX_GPUS)
    reserve = max(OS_RESERVE_MIN_MB, memtotal_mb * OS_RESERVE_PERCENT // 100) + gpus * DRIVER_RESERVE_PER_GPU_MB
    return max(1, memtotal_mb - reserve)


def gres_type(model: Any) -> str:
    """The GRES type of a GPU model: lower-cased (H100 -> h100), "" for no single model. NVML's
    autodetected names contain it (nvidia_h100_80gb_hbm3), which Slurm accepts as a match."""
    if model in (None, ""):
        return ""
    if not isinstance(model, str):
        raise SlurmConfError(f"gpu_model {model!r}: expected a model name such as A100")
    return _text(model.strip().lower().replace(" ", "_"), f"gpu_model {model!r} as a GRES type", _GRES_TYPE)


def node_from_facts(facts: Mapping[str, Any], gpus: Any = 0, gpu_model: Any = "", nvml: Any = False,
                    partition: Any = "", addr: Any = None) -> dict[str, Any]:
    """A node entry from Ansible's facts (hostname, processor_vcpus, processor_count,
    processor_cores, processor_threads_per_core, memtotal_mb, default_ipv4) and its GPU census.
    A topology whose product is not the CPU count (some hypervisors) is given as one socket of
    CPUs/threads cores, so the node never claims more than slurmd finds."""
    cpus = _int(facts.get("processor_vcpus") or facts.get("processor_nproc"), "processor_vcpus", 1, _MAX_CPUS)
    sockets = _int(facts.get("processor_count") or 1, "processor_count", 1, 1024)
    cores = _int(facts.get("processor_cores") or 1, "processor_cores", 1, _MAX_CPUS)
    threads = _int(facts.get("processor_threads_per_core") or 1, "processor_threads_per_core", 1, 16)
    if sockets * cores * threads != cpus:
        threads = threads if cpus % threads == 0 else 1
        sockets, cores = 1, cpus // threads
    if addr is None:
        addr = (facts.get("default_ipv4") or {}).get("address", "")
    gpus = _int(gpus or 0, "gpus", 0, _MAX_GPUS)
    return {
        "name": facts.get("hostname"), "addr": addr or "", "cpus": cpus, "sockets": sockets,
        "cores_per_socket": cores, "threads_per_core": threads,
        "memtotal_mb": _int(facts.get("memtotal_mb"), "memtotal_mb", 1, 1 << 40),
        "gpus": gpus, "gpu_model": gpu_model if gpus else "", "nvml": bool(nvml) and gpus > 0,
        "partition": partition or "",
    }


def _partition_of(node: Mapping[str, Any]) -> str:
    """The node's partition: its own, else its hardware ('8xa100', 'cpu')."""
    if node.get("partition"):
        return _text(node["partition"], f"node {node['name']}: partition", _PARTITION)
    if node["gpus"]:
        return f"{node['gpus']}x{node['gres_type'] or 'gpu'}"
    return "cpu"


def _node(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise SlurmConfError(f"a node: expected a mapping, got {raw!r}")
    name = _text(raw.get("name"), "node name", _NODE_NAME)
    node = {"name": name, "addr": _addr(raw.get("addr"), f"node {name}: addr")}
    for key, high in (("cpus", _MAX_CPUS), ("sockets", 1024), ("cores_per_socket", _MAX_CPUS),
                      ("threads_per_core", 16)):
        node[key] = _int(raw.get(key), f"node {name}: {key}", 1, high)
    if node["sockets"] * node["cores_per_socket"] * node["threads_per_core"] != node["cpus"]:
        raise SlurmConfError(f"node {name}: sockets x cores_per_socket x threads_per_core "
                             f"({node['sockets']}x{node['cores_per_socket']}x{node['threads_per_core']}) "
                             f"is not cpus ({node['cpus']})")
    node["gpus"] = _int(raw.get("gpus") or 0, f"node {name}: gpus", 0, _MAX_GPUS)
    node["gres_type"] = gres_type(raw.get("gpu_model")) if node["gpus"] else ""
    node["real_memory"] = real_memory(raw.get("memtotal_mb"), node["gpus"])
    node["nvml"] = bool(raw.get("nvml")) and node["gpus"] > 0
    node["partition"] = _partition_of({**raw, **node})
    return node


def dynamic_entries(entries: Any, hostvars: Any) -> list[dict[str, Any]]:
    """slurm_dynamic_nodes as the description takes them: an entry ``{name, like: HOST}`` has
    the resources of the play's compute host HOST (its own description: facts and GPUs, as the
    nodes booted from its image will have), under its own name and without an address."""
    out = []
    for entry in entries or []:
        if not isinstance(entry, Mapping):
            raise SlurmConfError(f"a dynamic node: expected a mapping, got {entry!r}")
        if "like" not in entry:
            out.append(dict(entry))
            continue
        like = entry["like"]
        base = (hostvars[like] if isinstance(like, str) and like in hostvars else {}).get("__slurm_node")
        if not isinstance(base, Mapping):
            raise SlurmConfError(f"dynamic node {entry.get('name')!r}: like {like!r} is no compute host of the play")
        out.append({**base, "name": entry.get("name"), "addr": ""})
    return out


def _dynamic(raw: Any) -> dict[str, Any]:
    node = _node(raw)
    if node["addr"]:
        raise SlurmConfError(f"dynamic node {node['name']}: no addr (Slurm learns it when the node "
                             "registers: cloud_reg_addrs)")
    return node


def _sharing(raw: Any) -> dict[str, Any]:
    """The cluster's GPU sharing: its mode, a MIG layout's instances per GPU, shards per GPU."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise SlurmConfError(f"gpu_sharing: expected a mapping, got {raw!r}")
    sharing = _text(raw.get("sharing") or "none", "gpu_sharing", _SHARING)
    mode, _, arg = sharing.partition(":")
    instances: dict[str, int] = {}
    if mode == "mig":
        given = raw.get("instances") or {}
        if not isinstance(given, Mapping):
            raise SlurmConfError(f"gpu_sharing {sharing}: instances: expected {{profile: count}}, got {given!r}")
        instances = {_text(p, f"gpu_sharing {sharing}: profile", _MIG_PROFILE): _int(n, f"gpu_sharing {p}", 1, 7)
                     for p, n in given.items()}
    shards = _int(arg, f"gpu_sharing {sharing}: shards per GPU", 2, _MAX_SHARDS) if mode == "shard" else 0
    return {"sharing": sharing, "mode": mode, "instances": instances, "shards": shards}


def _mig_gres(n: Mapping[str, Any], sharing: Mapping[str, Any]) -> list[tuple[str, int]]:
    """A GPU node's MIG instances under a layout, (profile, count on the node)."""
    if not sharing["instances"]:
        raise SlurmConfError(f"node {n['name']}: gpu_sharing {sharing['sharing']}: the layout's instances per GPU "
                             "are not given (gpuprov gives them where the lock names the GPU model; else "
                             "slurm_gpu_sharing_instances)")
    return [(p, count * n["gpus"]) for p, count in sharing["instances"].items()]


def _node_gres(n: Mapping[str, Any], sharing: Mapping[str, Any]) -> str:
    """A node's Gres= of slurm.conf: its GPUs (a MIG layout: its instances, by profile), and its
    shards or MPS share."""
    if not n["gpus"]:
        return ""
    if sharing["mode"] == "mig":
        gres = [f"gpu:{p}:{count}" for p, count in _mig_gres(n, sharing)]
    else:
        gres = [f"gpu:{n['gres_type']}:{n['gpus']}" if n["gres_type"] else f"gpu:{n['gpus']}"]
    if sharing["mode"] == "shard":
        gres.append(f"shard:{sharing['shards'] * n['gpus']}")
    elif sharing["mode"] == "mps":
        gres.append(f"mps:{MPS_PER_GPU * n['gpus']}")
    return " Gres=" + ",".join(gres)


def cluster(description: Mapping[str, Any]) -> dict[str, Any]:
    """The description checked and completed (each node's RealMemory, GRES type, partition)."""
    if not isinstance(description, Mapping):
        raise SlurmConfError(f"a cluster description: expected a mapping, got {description!r}")
    raw_name = description.get("cluster_name")
    name = _text(raw_name.lower() if isinstance(raw_name, str) else raw_name, "cluster_name", _CLUSTER_NAME)
    nodes = [_node(n) for n in description.get("nodes") or []]
    dynamic = [_dynamic(n) for n in description.get("dynamic_nodes") or []]
    if not nodes and not dynamic:
        raise SlurmConfError("no compute node: a cluster needs at least one node running slurmd")
    seen: set[str] = set()
    for node in [*nodes, *dynamic]:
        if node["name"] in seen:
            raise SlurmConfError(f"node {node['name']} is listed twice")
        seen.add(node["name"])
    default = _text(description.get("default_partition") or "all", "default_partition", _PARTITION)
    if default in {n["partition"] for n in [*nodes, *dynamic]}:
        raise SlurmConfError(f"partition {default!r} is the default partition's name: name the node's another")
    program = description.get("health_check_program") or ""
    prolog = description.get("task_prolog") or ""
    return {
        "cluster_name": name,
        "controller": _text(description.get("controller"), "controller", _NODE_NAME),
        "controller_addr": _addr(description.get("controller_addr"), "controller_addr"),
        "default_partition": default,
        "nodes": nodes,
        "dynamic_nodes": dynamic,
        "gpu_sharing": _sharing(description.get("gpu_sharing")),
        "power": _power(description.get("power"), dynamic),
        "task_prolog": _text(prolog, "task_prolog", _PATH) if prolog else "",
        "health_check_program": _text(program, "health_check_program", _PATH) if program else "",
        "health_check_interval": _int(description.get("health_check_interval", 300),
                                      "health_check_interval", 1, 86400),
        "accounting": _accounting(description.get("accounting")),
        "topology": bool(description.get("topology")),
    }


def _partitions(nodes: list[dict[str, Any]], default: str) -> list[tuple[str, list[dict[str, Any]]]]:
    named: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        named.setdefault(node["partition"], []).append(node)
    return [(default, nodes), *sorted(named.items())]


def slurm_conf(description: Mapping[str, Any]) -> str:
    """slurm.conf: identical on every node (Slurm checks its hash across the cluster)."""
    c = cluster(description)
    ctl = c["controller"] + (f"({c['controller_addr']})" if c["controller_addr"] else "")
    lines = [
        "# slurm.conf written by the slurm role (gpuprov); every node has this same file.",
        f"ClusterName={c['cluster_name']}",
        f"SlurmctldHost={ctl}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        f"StateSaveLocation={STATE_SAVE}",
        f"SlurmdSpoolDir={SLURMD_SPOOL}",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "# A node that was DOWN comes back when it registers with a valid configuration; a node",
        "# drained (by a person or a health check) stays drained until resumed.",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "GresTypes=" + {"shard": "gpu,shard", "mps": "gpu,mps"}.get(c["gpu_sharing"]["mode"], "gpu"),
        "# MPI programs (nccl-tests built with MPI) start under plain srun: PMIx, Slurm's plugin",
        "# with the distribution's libpmix (Open MPI on Debian 12 is built against the same).",
        "MpiDefault=pmix",
        "JobCompType=jobcomp/none",
        *accounting_lines(c),
        # topology.conf's switches (`sbatch --switches=N`), where the description gives any.
        *(["TopologyPlugin=topology/tree"] if c["topology"] else []),
    ]
    if c["task_prolog"]:
        lines.append(f"TaskProlog={c['task_prolog']}")
    if c["health_check_program"]:
        lines += [f"HealthCheckProgram={c['health_check_program']}",
                  f"HealthCheckInterval={c['health_check_interval']}",
                  "HealthCheckNodeState=ANY"]
    lines += power_lines(c)
    lines.append("")
    for n, state in [*((n, "UNKNOWN") for n in c["nodes"]), *((n, "CLOUD") for n in c["dynamic_nodes"])]:
        gres = _node_gres(n, c["gpu_sharing"])
        addr = f" NodeAddr={n['addr']}" if n["addr"] else ""
        lines.append(f"NodeName={n['name']}{addr} CPUs={n['cpus']} Sockets={n['sockets']} "
                     f"CoresPerSocket={n['cores_per_socket']} ThreadsPerCore={n['threads_per_core']} "
                     f"RealMemory={n['real_memory']}{gres} State={state}")
    lines.append("")
    # A job that names no memory gets, per CPU, the smallest share any node of its partition has.
    every = [*c["nodes"], *c["dynamic_nodes"]]
    for index, (name, members) in enumerate(_partitions(every, c["default_partition"])):
        per_cpu = min(n["real_memory"] // n["cpus"] for n in members) or 1
        lines.append(f"PartitionName={name} Nodes={','.join(n['name'] for n in members)} "
                     f"Default={'YES' if index == 0 else 'NO'} MaxTime=INFINITE State=UP DefMemPerCPU={per_cpu}")
    return _lines("\n".join(lines) + "\n", "slurm.conf")


# --- Accounting: slurmdbd ------------------------------------------------------------------
_MAX_WEIGHT = 1_000_000  # PriorityWeight* are 32-bit; a sane ceiling


def _accounting(raw: Any) -> dict[str, Any] | None:
    """The cluster's accounting: slurmdbd's host (an address or a host name) and the fairshare
    weight; None for none."""
    if not raw:
        return None
    if not isinstance(raw, Mapping):
        raise SlurmConfError(f"accounting: expected a mapping, got {raw!r}")
    host = _addr(raw.get("host"), "accounting host")
    if not host:
        raise SlurmConfError("accounting: no host (the node slurmdbd runs on)")
    return {"host": host,
            "fairshare_weight": _int(raw.get("fairshare_weight", 10000), "accounting fairshare_weight", 0, _MAX_WEIGHT)}


def _gpu_tres(c: Mapping[str, Any]) -> list[str]:
    """The GPU TRES accounting keeps: gres/gpu, each GPU type (a model, or a MIG profile) of its
    own, and shards or MPS shares where the cluster's GPUs are shared so."""
    sharing = c["gpu_sharing"]
    every = [*c["nodes"], *c["dynamic_nodes"]]
    if sharing["mode"] == "mig":
        types = set(sharing["instances"]) if any(n["gpus"] for n in every) else set()
    else:
        types = {n["gres_type"] for n in every if n["gpus"] and n["gres_type"]}
    extra = {"shard": ["gres/shard"], "mps": ["gres/mps"]}.get(sharing["mode"], [])
    return ["gres/gpu", *(f"gres/gpu:{t}" for t in sorted(types)), *extra]


def accounting_lines(c: Mapping[str, Any]) -> list[str]:
    """slurm.conf's accounting lines. None: no accounting (Slurm's own defaults, as before).
    With it: jobs recorded by slurmdbd (every job's user, account, nodes, GPUs as TRES, times),
    its resources gathered through the job's cgroup (ProctrackType is proctrack/cgroup), and
    the multifactor priority with fairshare (a user or account that used less waits less;
    age keeps a waiting job from starving). Jobs of users the database does not know still run
    (no AccountingStorageEnforce) and are recorded under their user."""
    acct = c.get("accounting")
    if acct is None:
        return ["AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none"]
    return [
        "# Accounting: slurmdbd (its own slurmdbd.conf and database) records every job.",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={acct['host']}",
        f"AccountingStorageTRES={','.join(_gpu_tres(c))}",
        "JobAcctGatherType=jobacct_gather/cgroup",
        "PriorityType=priority/multifactor",
        f"PriorityWeightFairshare={acct['fairshare_weight']}",
        "PriorityWeightAge=1000",
    ]


# --- Dynamic nodes: Slurm's power saving ---------------------------------------------------
# Bounds of the power settings, in seconds: (least, most).
_POWER_TIMES = {"suspend_time": (60, 7 * 86400), "suspend_timeout": (10, 3600), "resume_timeout": (30, 7200)}
_POWER_PROGRAMS = ("resume_program", "suspend_program", "resume_fail_program")
# A Slurm release as `sinfo --version` and Debian's package versions give it: 22.05.8, 24.11.5-4.
_SLURM_VERSION = re.compile(r"(\d{2})\.(\d{2})(?:\.\d+)?")


def slurm_version(text: Any) -> tuple[int, int]:
    """(major, minor) of a Slurm release: '22.05.8', '24.11.5-4+deb13u1', 'slurm 22.05.8'."""
    found = _SLURM_VERSION.search(text) if isinstance(text, str) else None
    if found is None:
        raise SlurmConfError(f"slurm_version {text!r}: expected a Slurm release such as 22.05.8")
    return int(found.group(1)), int(found.group(2))


def apt_version(text: Any, package: str) -> str:
    """The Version of ``package``'s stanza in `apt-cache show` output; '' where it has none."""
    for stanza in (text if isinstance(text, str) else "").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[:1] != " ")
        if fields.get("Package") == package:
            return fields.get("Version", "")
    return ""


def _power(raw: Any, dynamic: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not dynamic:
        if raw:
            raise SlurmConfError("power settings without a dynamic node: give dynamic_nodes, or no power")
        return None
    if not isinstance(raw, Mapping) or not raw:
        raise SlurmConfError(f"dynamic nodes need power settings (the programs Slurm runs), got {raw!r}")
    power: dict[str, Any] = {}
    for key, (low, high) in _POWER_TIMES.items():
        power[key] = _int(raw.get(key), f"power {key}", low, high)
    for key in _POWER_PROGRAMS:
        power[key] = _text(raw.get(key), f"power {key}", _PATH)
    power["version"] = slurm_version(raw.get("slurm_version"))
    return power


def power_lines(c: Mapping[str, Any]) -> list[str]:
    """slurm.conf's power saving lines for a cluster with dynamic nodes; none without.

    Static nodes are kept out of it (SuspendExcNodes): only dynamic nodes are ever powered
    down. A dynamic node needs no file of the cluster but the munge key: its slurmd fetches
    the configuration from slurmctld (`slurmd --conf-server`, enable_configless), and Slurm
    learns its address when it registers (cloud_reg_addrs), so nothing has to know it in advance, and slurmctld talks to every node directly (TreeWidth:
    a node cannot forward to another whose address it does not know). Idle is the state a
    node suspends into (idle_on_node_suspend), so a node powered down from a drain comes back
    clean. By version (seen on Debian 12's 22.05.8, 2026-12-04): before 23.02 `sinfo` hides
    powered-down cloud nodes unless PrivateData=cloud, and ReconfigFlags=KeepPowerSaveSettings
    is refused ("Invalid ReconfigFlag"); from 23.02 cloud nodes are shown by default and the
    flag keeps `scontrol update SuspendExcNodes=...` across a reconfigure."""
    power = c.get("power")
    if not power:
        return []
    lines = [
        "# Dynamic nodes (State=CLOUD): powered up by ResumeProgram when jobs need them, powered down",
        "# by SuspendProgram after SuspendTime idle seconds; static nodes never are (SuspendExcNodes).",
        f"SuspendTime={power['suspend_time']}",
        f"SuspendTimeout={power['suspend_timeout']}",
        f"ResumeTimeout={power['resume_timeout']}",
        f"ResumeProgram={power['resume_program']}",
        f"SuspendProgram={power['suspend_program']}",
        f"ResumeFailProgram={power['resume_fail_program']}",
        "SlurmctldParameters=enable_configless,idle_on_node_suspend,cloud_reg_addrs",
        "TreeWidth=65533",
    ]
    if c["nodes"]:
        lines.append(f"SuspendExcNodes={','.join(n['name'] for n in c['nodes'])}")
    if power["version"] < (23, 2):
        lines.append("PrivateData=cloud")
    else:
        lines.append("ReconfigFlags=KeepPowerSaveSettings")
    return lines


def _device_files(gpus: int) -> str:
    return "/dev/nvidia0" if gpus == 1 else f"/dev/nvidia[0-{gpus - 1}]"


def hosts_entries(description: Mapping[str, Any]) -> str:
    """The lines of ``/etc/hosts`` that let every node resolve every other node's Slurm name
    (``address name``, one per node and the controller, sorted by name). Slurm itself reaches a
    node through NodeAddr; a job does not: PyTorch's ``MASTER_ADDR`` taken from
    ``scontrol show hostnames $SLURM_JOB_NODELIST``, mpirun's host list, a user's ``ssh node-2``
    all resolve the name. Only nodes whose address is an IP address are listed (a DNS name
    resolves already); names and addresses are checked as for slurm.conf."""
    c = cluster(description)
    entries = {n["name"]: n["addr"] for n in c["nodes"] if n["addr"]}
    if c["controller_addr"]:
        entries.setdefault(c["controller"], c["controller_addr"])
    lines = []
    for name, addr in sorted(entries.items()):
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            continue
        lines.append(f"{addr} {name}")
    return _lines("\n".join(lines), "/etc/hosts entries")


# A network interface name as Linux allows it in practice (IFNAMSIZ: 15 characters).
_IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")


def tcp_interface(facts: Mapping[str, Any], addr: Any = None) -> str:
    """The interface that holds this node's Slurm address (NodeAddr: ``addr``, else the default
    route's address), '' when none does. Open MPI's TCP transport is kept to it
    (``OMPI_MCA_btl_tcp_if_include``): left alone it tries every interface, and a Docker bridge
    has the same address on every node (172.17.0.1), so a rank connects to its own bridge for
    its peer and waits forever (an allreduce across two nodes hangs)."""
    if not isinstance(facts, Mapping):
        return ""
    default = facts.get("default_ipv4") or {}
    wanted = addr or default.get("address") or ""
    if not wanted:
        return ""
    for name in facts.get("interfaces") or []:
        iface = facts.get(str(name).replace("-", "_")) or {}
        if not isinstance(iface, Mapping):
            continue
        held = [iface.get("ipv4") or {}, *(iface.get("ipv4_secondaries") or [])]
        held += list(iface.get("ipv6") or [])
        if any(isinstance(a, Mapping) and a.get("address") == wanted for a in held):
            return _text(str(name), "interface name", _IFACE)
    return ""


def gres_conf(description: Mapping[str, Any]) -> str:
    """gres.conf: NVML's autodetection on nodes that have it (real GPUs and Slurm's NVML
    plugin), else the device files one by one; nothing for a node without GPUs. A MIG layout:
    NVML finds the instances and their types (each job's CUDA_VISIBLE_DEVICES its MIG UUID);
    without NVML, each profile's count alone (``Count=``, no ``File=``: Slurm schedules the
    instances but cannot bind a job to its own, whose device files, /dev/nvidia-caps/*, are
    known only once the node made them). Shards and MPS: their count per node, which Slurm
    spreads evenly over the node's GPUs."""
    c = cluster(description)
    sharing = c["gpu_sharing"]
    lines = ["# gres.conf written by the slurm role (gpuprov); the same file on every node."]
    for n in [*c["nodes"], *c["dynamic_nodes"]]:
        if not n["gpus"]:
            continue
        if n["nvml"]:
            lines.append(f"NodeName={n['name']} AutoDetect=nvml")
        elif sharing["mode"] == "mig":
            lines += [f"NodeName={n['name']} AutoDetect=off Name=gpu Type={p} Count={count}"
                      for p, count in _mig_gres(n, sharing)]
        else:
            kind = f" Type={n['gres_type']}" if n["gres_type"] else ""
            lines.append(f"NodeName={n['name']} AutoDetect=off Name=gpu{kind} File={_device_files(n['gpus'])}")
        if sharing["mode"] == "shard":
            lines.append(f"NodeName={n['name']} Name=shard Count={sharing['shards'] * n['gpus']}")
        elif sharing["mode"] == "mps":
            lines.append(f"NodeName={n['name']} Name=mps Count={MPS_PER_GPU * n['gpus']}")
    return _lines("\n".join(lines) + "\n", "gres.conf")


def cgroup_conf(_description: Any = None) -> str:
    """cgroup.conf: each job held to its cores, its memory and its devices (GPUs)."""
    return "\n".join([
        "# cgroup.conf written by the slurm role (gpuprov).",
        "ConstrainCores=yes",
        "ConstrainDevices=yes",
        "ConstrainRAMSpace=yes",
    ]) + "\n"


def task_env(env: Any) -> str:
    """The lines the TaskProlog prints (``export NAME=value``): Slurm sets each in every task,
    the value taken literally to the end of its line. Names are checked; a value with a
    control character (a newline would add a line) is refused."""
    if env in (None, ""):
        env = {}
    if not isinstance(env, Mapping):
        raise SlurmConfError(f"task environment: expected a mapping of names to values, got {env!r}")
    lines = []
    for name in sorted(env):
        _text(name, "task environment name", _ENV_NAME)
        value = env[name]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SlurmConfError(f"task environment {name}: expected a string or number, got {value!r}")
        value = str(value)
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise SlurmConfError(f"task environment {name}: a control character (newline, tab, ...) in {value!r}")
        lines.append(f"export {name}={value}")
    return _lines("".join(line + "\n" for line in lines), "task environment")


class FilterModule:
    def filters(self):
        return {
            "slurm_conf": slurm_conf,
            "slurm_gres_conf": gres_conf,
            "slurm_cgroup_conf": cgroup_conf,
            "slurm_task_env": task_env,
            "slurm_hosts_entries": hosts_entries,
            "slurm_tcp_interface": tcp_interface,
            "slurm_node_from_facts": node_from_facts,
            "slurm_real_memory": real_memory,
            "slurm_apt_version": apt_version,
            "slurm_dynamic_entries": dynamic_entries,
        }
