"""The cost shapes of `list` (``ClusterPrice``) and `status` (``ClusterCost``): frozen
dataclasses, serialised by gpuprov.results.shapes like every result (docs/json-output.md)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClusterPrice:
    """What a cluster's running nodes cost per hour now (None: unknown, ``why`` says why)."""

    usd_per_hour: float | None
    why: str


@dataclass(frozen=True)
class NodeCost:
    """One node's launch time, price and cost since launch (list prices: an estimate)."""

    node: str
    launched: str | None
    kind: str  # on-demand | spot
    usd_per_hour: float | None
    usd_so_far: float | None
    source: str | None
    why: str | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> NodeCost:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ClusterCost:
    """`status`'s cost: each node's, then the cluster's totals (None: unknown, ``why`` says why)."""

    nodes: list[NodeCost]
    usd_per_hour: float | None
    usd_so_far: float | None
    why: str | None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> ClusterCost:
        return cls(nodes=[NodeCost.of(r) for r in data["nodes"]], usd_per_hour=data["usd_per_hour"],
                   usd_so_far=data["usd_so_far"], why=data["why"])


@dataclass(frozen=True)
class PlanCost:
    """What the planned cluster costs (`up --dry-run -o json`): its nodes at the node-hour's
    list price, with the price's kind, region, zone, source and date; None values and ``why``
    where there is no price (local and static clusters, a type with none known)."""

    nodes: int
    usd_per_node_hour: float | None
    usd_per_hour: float | None
    usd_per_day: float | None
    kind: str | None
    region: str | None
    zone: str | None
    source: str | None
    as_of: str | None
    why: str | None


@dataclass(frozen=True)
class UsageRow:
    """One user's, account's or job's use of a Slurm cluster in a window (`gpuprov usage`)."""

    key: str  # the user, account or job id (UsageResult.by says which)
    users: list[str]
    accounts: list[str]
    jobs: int
    gpu_hours: float
    node_hours: float
    usd: float | None
    why: str | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> UsageRow:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class UsageIdle:
    """The GPU-hours of the window no job held, and the part of the nodes' price no job paid."""

    gpu_hours: float
    usd: float | None
    why: str | None


@dataclass(frozen=True)
class UsageTotal:
    gpu_hours: float
    usd: float | None


@dataclass(frozen=True)
class UsagePrice:
    """A Slurm node's price per hour, where it comes from, or why it has none."""

    usd_per_hour: float | None
    source: str | None
    why: str | None


@dataclass(frozen=True)
class UsageResult:
    """`gpuprov usage`: who used the cluster's GPUs in the window, and what that cost."""

    cluster: str
    controller: str
    by: str  # user | account | job
    since: str
    until: str
    rows: list[UsageRow]
    idle: UsageIdle
    total: UsageTotal
    prices: dict[str, UsagePrice]

    @classmethod
    def of(cls, cluster: str, controller: str, data: Mapping[str, Any]) -> UsageResult:
        return cls(cluster=cluster, controller=controller, by=data["by"], since=data["since"], until=data["until"],
                   rows=[UsageRow.of(r) for r in data["rows"]], idle=UsageIdle(**data["idle"]),
                   total=UsageTotal(**data["total"]), prices={n: UsagePrice(**p) for n, p in data["prices"].items()})
