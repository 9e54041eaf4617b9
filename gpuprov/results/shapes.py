"""What the commands return: frozen dataclasses, turned into JSON in one place (``serialise``).

The JSON shapes are documented for users in docs/json-output.md; tests/unit/test_json_shapes.py
holds the two equal, both ways. A field's JSON name is its own unless its metadata says otherwise
(``pass``, ``from`` are Python keywords); an ``OPTIONAL`` field is left out of the JSON while it
is None (present only when it applies). This module imports nothing heavy: the CLI's `-o json`
path loads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuprov.lock.lock_data import LockData
from gpuprov.results.costs import ClusterCost, ClusterPrice, PlanCost, UsageResult
from gpuprov.results.json_form import JSON_NAME, OPTIONAL
from gpuprov.results.json_form import json_name as json_name
from gpuprov.results.json_form import serialise as serialise
from gpuprov.results.manifest import ManifestCheck

if TYPE_CHECKING:
    from gpuprov.state import NodeRecord, RunRecord

# -- nodes, list, status ------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeRow:
    """A node as its provider sees it."""

    name: str
    id: str
    address: str
    ssh_port: int
    state: str
    zone: str
    instance_type: str

    @classmethod
    def of(cls, node: NodeRecord) -> NodeRow:
        return cls(name=node.name, id=node.id, address=node.address, ssh_port=node.ssh_port,
                   state=node.state, zone=node.zone, instance_type=node.instance_type)


def node_rows(nodes: list[NodeRecord]) -> list[NodeRow]:
    return [NodeRow.of(n) for n in nodes]


@dataclass(frozen=True)
class ClusterRow:
    """One `list` row."""

    name: str
    provider: str
    nodes: int
    created: str
    state: str
    price: ClusterPrice | None = None  # the running nodes' price per hour now, or why none
    changed_by: str | None = None  # who last changed its record (user@host); None: not recorded
    changed_at: str | None = None  # when


@dataclass(frozen=True)
class Setting:
    """One recorded cluster setting and where its value came from."""

    value: str
    from_: str = field(metadata={JSON_NAME: "from"})


def settings_of(recorded: Mapping[str, Mapping[str, str]] | None) -> dict[str, Setting] | None:
    if recorded is None:
        return None
    return {k: Setting(value=v["value"], from_=v["from"]) for k, v in recorded.items()}


@dataclass(frozen=True)
class RunRow:
    """One recorded run (up's bootstrap, provision, verify, patch) of a cluster."""

    id: int
    kind: str
    started: str
    finished: str | None
    ok: bool | None
    artifact_dir: str | None

    @classmethod
    def of(cls, run: RunRecord) -> RunRow:
        return cls(id=run.id, kind=run.kind, started=run.started, finished=run.finished, ok=run.ok,
                   artifact_dir=run.artifact_dir)


@dataclass(frozen=True)
class StatusResult:
    cluster: str
    provider: str
    state: str
    failed_step: str | None
    created: str
    spec: dict[str, Any]
    stack: LockData | None
    settings: dict[str, Setting] | None
    nodes: list[NodeRow]
    runs: list[RunRow]
    # Each node's boot image (baked for the lock or not); nodes replaced, by what, oldest first.
    images: list[NodeImage] = field(default_factory=list)
    replaced: list[Replacement] = field(default_factory=list)
    # Nodes `up --min-count K --keep-failed` left running outside the node list (spec.kept).
    kept: list[KeptNode] = field(default_factory=list)
    # Each node's Slurm state and reason (clusters with `--scheduler slurm`; None otherwise).
    slurm: SlurmStatus | None = None
    cost: ClusterCost | None = None  # each node's launch time, price and cost so far; the totals
    driver_eol: str | None = None  # the lock's driver branch past its end of life: the warning; else None
    changed_by: str | None = None  # who last changed the cluster's record (user@host); None: not recorded
    changed_at: str | None = None  # when


@dataclass(frozen=True)
class SlurmNode:
    state: str  # Slurm's word: idle, allocated, mixed, drained, draining, down, ...
    reason: str  # why it is drained or down ("" for none)


@dataclass(frozen=True)
class PowerService:
    """A cluster's power service (dynamic nodes), as its address file and process say."""

    url: str | None
    running: bool
    last: list[str]  # the last lines of its log, oldest first
    # The node it runs on (aws: the Slurm controller, as gpuprov-power-aws.service); None: this machine.
    on_node: str | None = None


@dataclass(frozen=True)
class Protection:
    """Failed resumes in a row (gpuprov.core.elastic, "protected mode"): how many, the last
    one's reason, and once they reached the limit the partitions set INACTIVE and when."""

    failures: int
    last: str
    partitions: list[str]  # [] until protected mode began
    since: str  # UTC, "" until protected mode began


@dataclass(frozen=True)
class DynamicNodes:
    """A cluster's dynamic nodes (`--max-count`): how many, their idle time, their image."""

    max_count: int
    dynamic: int
    idle_minutes: int
    image: str | None  # the image they boot from; None until one is baked
    service: PowerService
    protection: Protection | None = None  # None: no failed resume since the last node came up
    replace_unhealthy: bool = False  # `--replace-unhealthy`: static nodes drained by their health replaced


@dataclass(frozen=True)
class SlurmStatus:
    controller: str
    nodes: dict[str, SlurmNode]  # by Slurm's node name (the node's short hostname)
    error: str | None = None  # the controller did not answer: why, in one line
    dynamic: DynamicNodes | None = None  # None for a cluster without --max-count


@dataclass(frozen=True)
class Replacement:
    """A node that left the cluster, what took its place and why: a roll onto an image (`patch
    --onto-image`), or a node `up --min-count K` set aside for a failed bootstrap or health gate."""

    old: str
    new: str | None  # None: nothing took its place (up's --retries spent, or no capacity)
    why: str
    when: str
    kept: bool = False  # up --keep-failed: ``old`` still runs, outside the node list
    old_id: str | None = field(default=None, metadata={OPTIONAL: True})
    new_id: str | None = field(default=None, metadata={OPTIONAL: True})

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Replacement:
        """From a record of the cluster's ``spec.replaced``."""
        return cls(old=entry["old"], new=entry.get("new"), why=entry["why"], when=entry["when"],
                   kept=bool(entry.get("kept")), old_id=entry.get("old_id"), new_id=entry.get("new_id"))


@dataclass(frozen=True)
class KeptNode:
    """A node `up --min-count K --keep-failed` set aside: running, out of the node list; `down` removes it."""

    name: str
    id: str
    address: str
    why: str
    when: str


@dataclass(frozen=True)
class NodeImage:
    """The image one node booted from (where its provider says)."""

    node: str
    image: str
    # The lock hash the image was baked for, and whether it is the cluster's (None: not baked).
    baked_for: str | None
    matches_lock: bool | None


@dataclass(frozen=True)
class ImageUsed:
    """What `up` booted new nodes from, and why."""

    ref: str | None  # None: the provider's default image
    baked_for: str | None  # the lock hash of the baked image used, else None
    reason: str


@dataclass(frozen=True)
class SettingsResult:
    cluster: str
    settings: dict[str, Setting] | None
    changed: list[str]


# -- provision and up -----------------------------------------------------------------------------
@dataclass(frozen=True)
class HostStats:
    """What one playbook run did on one node (Ansible's final stats)."""

    ok: int
    changed: int
    failed: int
    unreachable: int
    tasks: int

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> HostStats:
        return cls(ok=int(counts.get("ok", 0)), changed=int(counts.get("changed", 0)),
                   failed=int(counts.get("failed", 0)), unreachable=int(counts.get("unreachable", 0)),
                   tasks=int(counts.get("tasks", 0)))


# A node that was not reached: nothing ran there.
UNREACHED = HostStats(ok=0, changed=0, failed=0, unreachable=1, tasks=0)


@dataclass(frozen=True)
class ProvisionResult:
    cluster: str
    ok: bool
    hosts: dict[str, HostStats]
    errors: dict[str, str]
    manifest: dict[str, ManifestCheck] | None = field(default=None, metadata={OPTIONAL: True})
    would_change: dict[str, list[str]] | None = field(default=None, metadata={OPTIONAL: True})  # --check


@dataclass(frozen=True)
class Bootstrap:
    """`up`'s bootstrap: provision's per-node counts, or where a finished cluster was left."""

    ok: bool
    hosts: dict[str, HostStats]
    errors: dict[str, str]
    resumed_from: str | None = field(default=None, metadata={OPTIONAL: True})
    # A pull bootstrap (`up --bootstrap pull`): the bundle and the nodes' own probe runs.
    pull: PullReport | None = field(default=None, metadata={OPTIONAL: True})
    # A cluster that existed before (grown, resumed): each node's manifest verdict, as provision's.
    manifest: dict[str, ManifestCheck] | None = field(default=None, metadata={OPTIONAL: True})

    @classmethod
    def of(cls, done: ProvisionResult, pull: PullReport | None = None) -> Bootstrap:
        return cls(ok=done.ok, hosts=done.hosts, errors=done.errors, pull=pull, manifest=done.manifest)


@dataclass(frozen=True)
class UpResult:
    cluster: str
    provider: str
    nodes: list[NodeRow]
    bootstrap: Bootstrap | None
    dry_run: bool | None = field(default=None, metadata={OPTIONAL: True})
    # The health checks run after the bootstrap (`--health`), and the image new nodes booted from
    # (providers with images: docker, aws); each left out when there is none.
    health: HealthResult | None = field(default=None, metadata={OPTIONAL: True})
    image: ImageUsed | None = field(default=None, metadata={OPTIONAL: True})
    # --min-count: the nodes this run set aside (failed bootstrap or health) and their
    # replacements; --dry-run: what the planned cluster costs (`status` has a cluster's cost).
    replaced: list[Replacement] | None = field(default=None, metadata={OPTIONAL: True})
    cost: PlanCost | None = field(default=None, metadata={OPTIONAL: True})
    # The probes `up` ran once bootstrapped and healthy; its last line (gpuprov.core.up_verdict).
    verify: VerifyResult | None = field(default=None, metadata={OPTIONAL: True})
    verdict: Verdict | None = field(default=None, metadata={OPTIONAL: True})


@dataclass(frozen=True)
class Verdict:
    """``ready``: probes passed; False: a step failed; None: bootstrapped, not verified."""

    ready: bool | None
    why: str
    next: str


# -- verify ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRow:
    probe: str
    status: str  # "pass" | "fail" | "skip"
    detail: str

    @classmethod
    def of(cls, row: Mapping[str, str]) -> ProbeRow:
        return cls(probe=row["probe"], status=row["status"], detail=row["detail"])


@dataclass(frozen=True)
class VerifySummary:
    pass_: int = field(metadata={JSON_NAME: "pass"})
    fail: int
    skip: int


@dataclass(frozen=True)
class PullReport:
    """The bundle a pull bootstrap's nodes ran (its sha256 and size), and the totals of the
    probes they then ran on themselves (left out when a node ran none: its bootstrap failed)."""

    bundle_sha256: str
    bundle_bytes: int
    verify: VerifySummary | None = field(default=None, metadata={OPTIONAL: True})


@dataclass(frozen=True)
class VerifyResult:
    cluster: str
    ok: bool
    hosts: dict[str, list[ProbeRow]]
    summary: VerifySummary


# -- patch -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PatchHost:
    """One node of a roll. ``status``: patched | unchanged | replaced | failed | not-started."""

    status: str
    changed: int
    rebooted: bool
    plan: list[str] = field(default_factory=list)
    plan_error: str | None = field(default=None, metadata={OPTIONAL: True})
    moved: list[str] | None = field(default=None, metadata={OPTIONAL: True})
    error: str | None = field(default=None, metadata={OPTIONAL: True})
    reboot_skipped: str | None = field(default=None, metadata={OPTIONAL: True})
    replaced_by: str | None = field(default=None, metadata={OPTIONAL: True})
    slurm: str | None = field(default=None, metadata={OPTIONAL: True})  # Slurm clusters: drained, resumed, ...

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> PatchHost:
        """From the roll's working record of the node (patch.py keeps it as it goes)."""
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {k: (list(v) if isinstance(v, (list, tuple)) else v)
                                  for k, v in state.items() if k in known}
        return cls(**values)


@dataclass(frozen=True)
class LockMove:
    """The stored version lock's hash before the roll and the one it moves to."""

    from_: str | None = field(metadata={JSON_NAME: "from"})
    to: str


@dataclass(frozen=True)
class PatchResult:
    cluster: str
    ok: bool
    batches: list[list[str]]
    hosts: dict[str, PatchHost]
    lock: LockMove
    # --onto-image: the image the nodes were (or would be) replaced from; absent in place.
    image: str | None = field(default=None, metadata={OPTIONAL: True})


# -- health ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HealthCheck:
    """One check on one node (gpuprov.health). ``status``: pass | fail | skip."""

    node: str
    check: str
    status: str
    found: str
    expected: str
    action: str
    reason: str | None = field(default=None, metadata={OPTIONAL: True})


@dataclass(frozen=True)
class HealthResult:
    cluster: str
    level: str
    ok: bool
    started: str
    finished: str
    checks: list[HealthCheck]
    summary: VerifySummary


@dataclass
class MonitorResult:
    """`gpuprov monitor`: the monitoring play on each node, and where Prometheus answers."""

    cluster: str
    ok: bool
    host: str
    prometheus: str | None  # http://ADDRESS:PORT, as the host's Prometheus listens
    alertmanager: str  # where Alertmanager listens on the host (loopback)
    tunnel: str | None  # an ssh command that forwards Prometheus's port here (remote clusters)
    hosts: dict[str, HostStats] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SlurmAccount:
    account: str
    users: list[str]  # its users' associations, sorted (none: the account alone)


@dataclass(frozen=True)
class SlurmAccounts:
    """`gpuprov slurm account list`: the accounts and users Slurm's accounting knows."""

    cluster: str
    controller: str
    accounts: list[SlurmAccount]


SHAPES: dict[str, Any] = {  # what each command prints with `-o json` (docs/json-output.md)
    "up": UpResult,
    "list": list[ClusterRow],
    "status": StatusResult,
    "settings": SettingsResult,
    "provision": ProvisionResult,
    "verify": VerifyResult,
    "patch": PatchResult,
    "health": HealthResult,
    "monitor": MonitorResult,
    "usage": UsageResult,
    "slurm": SlurmAccounts,
}
