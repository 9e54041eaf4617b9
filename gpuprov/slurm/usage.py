"""Who used a Slurm cluster's GPUs, and what that cost: `sacct` on the controller, priced by
each node's own price (docs/slurm.md, "Accounting and usage").

The arithmetic, on what Slurm's accounting says of each job (its user, account, nodes, GPUs as the
``gres/gpu`` TRES, start and end) and what gpuprov knows of each node (its type, region, on-demand
or spot, hence its price with the price's date and source):

- A job's hours are its time inside the asked window (a job running now counts up to now).
- GPU-hours: the job's GPUs x its hours. Node-hours: its nodes x its hours.
- Cost: on each of its nodes, the job pays its share of the node's price for its hours: the
  GPUs it holds there over the node's GPUs (a job's GPUs spread evenly over its nodes, as
  ``--gres=gpu:N`` asks N on each), or, for a job with no GPU, its CPUs there over the node's
  CPUs. Slurm may give a job every core of a node and one of its GPUs: the GPU share is what
  is charged (the scarce part).
- Idle: each node's GPU-hours in the window that no job held, and the part of its price no job
  paid, as its own row: what the cluster cost while nobody used it.

A node without a price (a local or static cluster, or a type gpuprov has no price for) leaves
every cost it would be part of unknown, with why; the hours are still shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.errors import GpuprovError
from gpuprov.slurm.elastic import hostnames

# The fields `gpuprov usage` asks of sacct, in this order (--parsable2: '|' between them, none
# at the end); --allocations: one line per job (its allocation), not one per step.
SACCT_FIELDS = ("JobID", "User", "Account", "Partition", "NodeList", "NNodes", "AllocTRES", "Start", "End",
                "ElapsedRaw", "State")
SINFO_GRES = ("sinfo", "--Node", "--noheader", "--format=%N|%c|%G")
BY = ("user", "account", "job")
_TRES_GPU = re.compile(r"^gres/gpu(?::[^=]+)?$")


def sacct_argv(since: datetime, until: datetime) -> tuple[str, ...]:
    """The sacct command for the jobs of a window, every user's (read on the controller)."""
    return ("sacct", "--allusers", "--allocations", "--parsable2", "--noheader",
            f"--starttime={slurm_time(since)}", f"--endtime={slurm_time(until)}",
            f"--format={','.join(SACCT_FIELDS)}")


def slurm_time(at: datetime) -> str:
    """A moment as sacct reads it: the controller's local time, written without a zone; gpuprov's
    nodes keep UTC (the node image's and Debian's default), so UTC is what is written."""
    return utc_text(at).removesuffix("Z")


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    account: str
    partition: str
    nodes: tuple[str, ...]
    gpus: int  # in all, across its nodes (AllocTRES gres/gpu, every GPU type summed)
    cpus: int
    start: datetime | None  # None: it has not started
    end: datetime | None  # None: it runs still
    state: str


def _time(text: str) -> datetime | None:
    if text in ("Unknown", "None", ""):
        return None
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        raise GpuprovError(f"sacct: {text[:40]!r} is not a time") from None


def tres(text: str) -> dict[str, int]:
    """AllocTRES (``billing=1,cpu=2,gres/gpu=4,mem=1G,node=2``) as its counts; memory and other
    unit-bearing values are left out (usage counts CPUs and GPUs)."""
    out: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if value.isdigit():
            out[key] = out.get(key, 0) + int(value)
    return out


def gpus_of(counts: dict[str, int]) -> int:
    """The GPUs a job holds: ``gres/gpu``, or its typed counts (``gres/gpu:a100``) where the
    untyped one is missing."""
    if "gres/gpu" in counts:
        return counts["gres/gpu"]
    return sum(v for k, v in counts.items() if _TRES_GPU.match(k))


def parse_sacct(text: str) -> list[Job]:
    """sacct's lines (``sacct_argv``'s format) as jobs; a line of another shape is an error,
    named, never a guess."""
    jobs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(SACCT_FIELDS):
            raise GpuprovError(f"sacct line {number}: {len(fields)} fields, expected {len(SACCT_FIELDS)} "
                               f"({','.join(SACCT_FIELDS)})")
        row = dict(zip(SACCT_FIELDS, fields, strict=True))
        counts = tres(row["AllocTRES"])
        jobs.append(Job(job_id=row["JobID"], user=row["User"], account=row["Account"], partition=row["Partition"],
                        nodes=tuple(hostnames(row["NodeList"])), gpus=gpus_of(counts), cpus=counts.get("cpu", 0),
                        start=_time(row["Start"]), end=_time(row["End"]), state=row["State"].split(" ", 1)[0]))
    return jobs


@dataclass(frozen=True)
class NodeFacts:
    """What usage needs of one Slurm node: its CPUs and GPUs (Slurm's own, from sinfo), its
    price per hour (None: unknown, ``why``) and where the price comes from."""

    cpus: int
    gpus: int
    usd_per_hour: float | None = None
    source: str | None = None
    why: str | None = None
    since: datetime | None = None  # when it came up (launch time), where known
    always_up: bool = True  # False: a dynamic node, up only while Slurm powers it (not in the idle row)


def parse_sinfo_gres(text: str) -> dict[str, tuple[int, int]]:
    """``sinfo --Node --format=%N|%c|%G`` as {node: (CPUs, GPUs)} (``gpu:2``, ``gpu:h100:8``,
    ``gpu:1g.10gb:7(S:0)``, several joined by ',')."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        gpus = 0
        for gres in _gres_items(parts[2]):
            name, *rest = gres.split("(", 1)[0].split(":")
            count = rest[-1] if rest else ""
            if name == "gpu" and count.isdigit():
                gpus += int(count)
        out[parts[0]] = (int(parts[1]), gpus)
    return out


def _gres_items(text: str) -> list[str]:
    """A GRES list split on the commas outside parentheses (``gpu:2(S:0-1),shard:8``)."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [i for i in (*items, current) if i and i != "(null)"]


def _hours(job: Job, since: datetime, until: datetime) -> float:
    if job.start is None:
        return 0.0
    start, end = max(job.start, since), min(job.end or until, until)
    return max((end - start).total_seconds(), 0.0) / 3600


@dataclass
class Row:
    key: str
    jobs: int = 0
    gpu_hours: float = 0.0
    node_hours: float = 0.0
    usd: float | None = 0.0
    why: set[str] = field(default_factory=set)
    users: set[str] = field(default_factory=set)
    accounts: set[str] = field(default_factory=set)

    def add(self, hours: float, job: Job, usd: float | None, why: str | None) -> None:
        self.jobs += 1
        self.gpu_hours += job.gpus * hours
        self.node_hours += len(job.nodes) * hours
        self.users.add(job.user)
        self.accounts.add(job.account)
        if usd is None:
            self.usd = None
            if why:
                self.why.add(why)
        elif self.usd is not None:
            self.usd += usd

    def public(self) -> dict[str, Any]:
        return {"key": self.key, "users": sorted(self.users), "accounts": sorted(self.accounts), "jobs": self.jobs,
                "gpu_hours": round(self.gpu_hours, 4), "node_hours": round(self.node_hours, 4),
                "usd": None if self.usd is None else round(self.usd, 4), "why": "; ".join(sorted(self.why)) or None}


def _charge(job: Job, node: NodeFacts, hours: float) -> float | None:
    """What ``job`` pays for ``hours`` on one of its nodes (None: the node's price is unknown)."""
    if node.usd_per_hour is None:
        return None
    if job.gpus and node.gpus:
        share = min(job.gpus / len(job.nodes) / node.gpus, 1.0)
    elif node.cpus:
        share = min(job.cpus / len(job.nodes) / node.cpus, 1.0)
    else:
        share = 1.0
    return share * node.usd_per_hour * hours


def usage(jobs: list[Job], nodes: dict[str, NodeFacts], since: datetime, until: datetime,
          by: str = "user") -> dict[str, Any]:
    """Rows by ``by`` (user, account or job), the idle row, and the totals, over the window."""
    if by not in BY:
        raise GpuprovError(f"usage by {by!r}: one of {', '.join(BY)}")
    rows: dict[str, Row] = {}
    held: dict[str, tuple[float, float]] = {n: (0.0, 0.0) for n in nodes}  # node: (GPU-hours, USD) jobs held
    for job in jobs:
        hours = _hours(job, since, until)
        if hours <= 0 or not job.nodes:
            continue
        usd: float | None = 0.0
        why = None
        for name in job.nodes:
            node = nodes.get(name)
            if node is None:
                usd, why = None, f"{name}: not a node of this cluster now (its price is unknown)"
                continue
            paid = _charge(job, node, hours)
            gpu_h, usd_h = held[name]
            held[name] = (gpu_h + (job.gpus / len(job.nodes)) * hours, usd_h + (paid or 0.0))
            if paid is None:
                usd, why = None, node.why
            elif usd is not None:
                usd += paid
        key = {"user": job.user, "account": job.account, "job": job.job_id}[by]
        rows.setdefault(key, Row(key)).add(hours, job, usd, why)
    idle = _idle(nodes, held, since, until)
    ordered = sorted(rows.values(), key=lambda r: (-r.gpu_hours, -r.node_hours, r.key))
    used = [r.public() for r in ordered]
    known = [r["usd"] for r in used] + [idle["usd"]]
    return {
        "by": by, "since": utc_text(since), "until": utc_text(until),
        "rows": used, "idle": idle,
        "total": {"gpu_hours": round(sum(r["gpu_hours"] for r in used) + idle["gpu_hours"], 4),
                  "usd": None if any(u is None for u in known) else round(sum(known), 4)},
        "prices": {n: {"usd_per_hour": f.usd_per_hour, "source": f.source, "why": f.why}
                   for n, f in sorted(nodes.items())},
    }


def _idle(nodes: dict[str, NodeFacts], held: dict[str, tuple[float, float]], since: datetime,
          until: datetime) -> dict[str, Any]:
    """Each node's GPU-hours in the window no job held, and the part of its price no job paid."""
    gpu_hours, usd, whys = 0.0, 0.0, set()
    for name, node in nodes.items():
        if not node.always_up:
            continue
        start = max(since, node.since) if node.since else since
        hours = max((until - start).total_seconds(), 0.0) / 3600
        gpu_h, paid = held.get(name, (0.0, 0.0))
        gpu_hours += max(node.gpus * hours - gpu_h, 0.0)
        if node.usd_per_hour is None:
            whys.add(node.why or f"{name}: no price")
        else:
            usd += max(node.usd_per_hour * hours - paid, 0.0)
    return {"gpu_hours": round(gpu_hours, 4), "usd": None if whys else round(usd, 4),
            "why": "; ".join(sorted(whys)) or None}
