"""`provision NAME --via pull`: the nodes of a cluster converge themselves again, as at a pull
bootstrap (gpuprov.pull): this gpuprov's bundle built for the cluster's lock, served from this
machine (or published in the provider's object store: aws's bucket), each node handed the agent
and its configuration over SSH (pinned host key), the nodes' reports followed as push progress
and recorded (run `provision-pull`, the nodes' own probes as `verify-quick`, each node's
manifest). The controller runs no task: the nodes do the work.

As push `provision`: a node whose manifest holds for the same inputs is reported unchanged and
not run (`--full` runs every node), an unreachable node is named once and left out, `--tags`
runs some plays (and writes no manifest). Refused, with nothing changed: `--check` (the agent
converges for real), a cluster with Slurm (pull never configures Slurm), a registry password
in the environment (the bundle carries no secret), a provider pull cannot reach."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuprov.ansible.inventory import render
from gpuprov.cluster import check_reachable, expectations, version_lock
from gpuprov.console import Console
from gpuprov.core.monitoring import monitoring_host
from gpuprov.errors import BadInput
from gpuprov.manifest import steps as manifests
from gpuprov.providers import ClusterFiles, ClusterSpec, Provider
from gpuprov.pull import controller
from gpuprov.results.shapes import UNREACHED, ProvisionResult
from gpuprov.settings import play_secrets
from gpuprov.slurm import scheduler
from gpuprov.state import ClusterRecord, NodeRecord, Store

KIND = "provision-pull"


@dataclass
class Round:
    """What the controller's pull paths read of a run (as of an `up`'s, gpuprov.core.up_steps.Run)."""

    spec: ClusterSpec
    provider: Provider
    store: Store
    console: Console
    files: ClusterFiles
    tags: list[str]
    pull: controller.Session | None = None
    cluster: ClusterRecord | None = None  # its record, where a round needs it (gpuprov.core.patch_pull)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def made_files(self) -> ClusterFiles:
        return self.files


def refuse(cluster: ClusterRecord, provider: Provider, spec: ClusterSpec, nodes: list[NodeRecord]) -> None:
    """BadInput where `--via pull` cannot converge this cluster; nothing has changed yet."""
    if scheduler.of(cluster).kind != "none":
        raise BadInput(f"--via pull does not configure Slurm, and {cluster.name} runs it; use --via push")
    if play_secrets():
        raise BadInput("--via pull does not carry GPUPROV_REGISTRY_PASSWORD to the nodes "
                       "(the bundle holds no secret); use --via push")
    if not (provider.supports("pull_channel") or provider.supports("pull_address")):
        raise BadInput(f"--via pull is not built for the {provider.name} provider yet; use --via push")
    if not provider.supports("pull_channel"):
        provider.pull_address(spec, nodes)  # hosts that could not reach this machine: refused


def converge(store: Store, cluster: ClusterRecord, provider: Provider, files: ClusterFiles, nodes: list[NodeRecord],
             *, console: Console, tags: list[str] | None, use_manifest: bool) -> ProvisionResult:
    """The nodes (those that answer, whose manifest does not hold) converge themselves."""
    spec = ClusterSpec.from_record(cluster.name, cluster.provider, cluster.spec)
    refuse(cluster, provider, spec, nodes)
    lock = version_lock(store, cluster)
    context = render(cluster.name, cluster.provider, nodes, expectations(provider, nodes, lock), files,
                     monitoring_host(cluster.spec))
    # The digest a pulled node's manifest is recorded with (the bundle's) is push's for the same
    # inputs: a node's verdict is read as push `provision` reads it.
    scope, inputs = manifests.inputs_of(context, controller.play_vars(cluster, lock), tags)
    whole = not tags
    verdicts = manifests.verdicts(cluster, files, nodes, inputs, scope) if use_manifest and whole else {}
    to_run = manifests.to_run(nodes, verdicts, slurm=False, say=console.say)
    reachable, down = check_reachable(files, to_run, console)
    outcome = ProvisionResult(cluster=cluster.name, ok=True, hosts={}, errors={})
    if reachable:
        run = Round(spec=spec, provider=provider, store=store, console=console, files=files, tags=list(tags or ()))
        outcome = controller.existing(run, cluster, reachable, KIND)
    hosts = {**outcome.hosts, **dict.fromkeys(down, UNREACHED)}
    errors = {**outcome.errors, **{n: f"unreachable: {why}" for n, why in down.items()}}
    if down:
        store.set_failed_step(cluster.name, "bootstrap")
    outcome = replace(outcome, ok=outcome.ok and not down, hosts=hosts, errors=errors)
    return manifests.merged(outcome, nodes, verdicts)
