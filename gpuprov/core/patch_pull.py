"""`patch NAME --via pull`: a roll whose plays run on the nodes themselves.

The roll is push's (gpuprov.core.patch: the plan, the baseline, batch by batch behind the
drain and resume hooks and the health gate, the lock moved when every node has it); only where
Ansible and the probes run differs. Each round is a pull round (gpuprov.pull.controller
``existing``: this gpuprov's bundle, served from here or published in the provider's object
store, each node handed the agent and its configuration over SSH with the pinned host key):

- the plan: every reachable node runs ``patch.yml`` in check mode with the roll's variables,
  then its probes against the lock it runs now (the baseline); its report of what would move
  is read as push reads its own;
- each batch: the batch's drained nodes run ``patch.yml`` for real, then their probes against
  the new lock.

The controller runs no task and no probe: it publishes a bundle per round and reads reports
(the health checks stay one SSH command per node, as in push). A node's own run never reboots
it (Ansible's reboot cannot run over a local connection): where a move needs a reboot, the
node says so and the roll goes on as push's with reboots not allowed (`--no-reboot`); `--via
push` reboots. Refused, with nothing changed: a cluster with Slurm (its drained nodes' probes
need push's expectations), a registry password in the environment (a bundle holds no secret),
a provider pull cannot reach, `--onto-image` (a roll of replacements, not of plays)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuprov.core import via_pull
from gpuprov.core.patch_plan import host_reports
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec
from gpuprov.pull import controller
from gpuprov.results.shapes import HostStats
from gpuprov.slurm import scheduler

if TYPE_CHECKING:
    from gpuprov.ansible.runner import PlaybookResult
    from gpuprov.console import Console
    from gpuprov.core.patch import Roll
    from gpuprov.providers import ClusterFiles, Provider
    from gpuprov.state import ClusterRecord, NodeRecord, Store

PLAN_KIND = "patch-pull-plan"
BATCH_KIND = "patch-pull"
NO_REBOOT = ("pull: the node's own run does not reboot it (Ansible's reboot needs a connection from outside); "
             "`--via push` reboots it")


@dataclass
class Played:
    """One round's outcome per node, as push's run gives it: Ansible's stats, errors, the
    patch report, and (pull) the probe rows the node ran on itself after the plays."""

    hosts: dict[str, dict[str, int]]
    errors: dict[str, str]
    reports: dict[str, dict[str, Any]]
    rows: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def pushed(result: PlaybookResult) -> Played:
    """A push run's (gpuprov.ansible.runner's result) outcome as a Played."""
    return Played(hosts=result.hosts, errors=result.errors, reports=host_reports(result.artifact_dir))


def begin(store: Store, cluster: ClusterRecord, provider: Provider, files: ClusterFiles, nodes: list[NodeRecord],
          console: Console) -> via_pull.Round:
    """The pull rounds' context, once the cluster is locked and refreshed; BadInput (nothing
    changed yet) where pull cannot patch this cluster (`--onto-image` is refused with the
    request: gpuprov.core.patch_plan)."""
    if scheduler.of(cluster).kind != "none":
        raise BadInput(f"--via pull does not patch a cluster that runs Slurm, and {cluster.name} does; use --via push")
    spec = ClusterSpec.from_record(cluster.name, cluster.provider, cluster.spec)
    via_pull.refuse(cluster, provider, spec, nodes)
    return via_pull.Round(spec=spec, provider=provider, store=store, console=console, files=files, tags=[],
                          cluster=cluster)


def plan_round(roll: Roll) -> Played:
    """The plan: check mode on every reachable node, the probes held to the lock they run now."""
    plays = controller.Plays(lock=roll.old, extravars=roll.extravars, check=True)
    return _round(roll, list(roll.by_name), plays, PLAN_KIND)


def batch_round(roll: Roll, ready: list[str]) -> Played:
    """One batch, for real, the probes held to the new lock; no reboot from the node's own run."""
    plays = controller.Plays(lock=roll.lock, extravars={**roll.extravars, "gpuprov_patch_reboot": False})
    played = _round(roll, ready, plays, BATCH_KIND)
    for report in played.reports.values():
        if str(report.get("reboot_skipped", "")).startswith("reboot not allowed"):
            report["reboot_skipped"] = NO_REBOOT
    return played


def _round(roll: Roll, names: list[str], plays: controller.Plays, kind: str) -> Played:
    outcome: dict[str, Any] = {}
    assert roll.pull is not None and roll.pull.cluster is not None, "the rounds' context is made by begin() first"
    result = controller.existing(roll.pull, roll.pull.cluster, [roll.by_name[n] for n in names], kind, plays=plays,
                                 outcome=outcome)
    hosts = {h: dataclasses.asdict(s) if isinstance(s, HostStats) else dict(s) for h, s in result.hosts.items()}
    return Played(hosts=hosts, errors=dict(result.errors),
                  reports={n: dict(got["report"]) for n, got in outcome.items() if isinstance(got.get("report"), dict)},
                  rows={n: list(got.get("probes") or ()) for n, got in outcome.items()})
