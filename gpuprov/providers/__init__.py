"""Provider interface: a cluster spec in, reachable nodes out, and back.

plan (validate, price, quota) -> launch (idempotent, all-or-nothing) ->
wait_ready (SSH reachable, host keys pinned) -> describe -> terminate.

Inputs and outputs are frozen dataclasses. Providers are looked up by name
and imported lazily, so the CLI never pays for an SDK it does not use.
Providers never import click.

This interface is the only way core reaches a provider: each provider checks its
own flags (check_spec), differences in behaviour are attributes (adopts_existing,
pins_without_bootstrap, billable), and optional abilities (unasked_plan, dry_run, terminate_nodes,
find_orphans/destroy_orphans, list_tagged_clusters) have defaults here that do
nothing or raise NotSupported; ``supporting(ability)`` lists the providers that have one.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuprov import __version__, identity
from gpuprov.errors import BadInput, NotSupported
from gpuprov.providers import spec
from gpuprov.providers.spec import (
    DEFAULT_PROVIDER,
    PROVIDERS,
    ClusterSpec,
    ProviderFacts,
    ProviderOptions,
    facts,
    flag,
    having,
    options_for,
    options_type,
)

if TYPE_CHECKING:  # annotations only: the CLI's start-up does not pay for the state's sqlite3
    from gpuprov.pricing.prices import Price
    from gpuprov.state import NodeRecord


@dataclass(frozen=True)
class ClusterFiles:
    """Where a cluster's local files live (all under the state dir, 0700)."""

    dir: Path

    @property
    def key(self) -> Path:
        """The cluster's own private key (made by `up`; stays on its maker's machine)."""
        return self.dir / "id_ed25519"

    @property
    def login_key(self) -> Path:
        """The key gpuprov's connections to the nodes log in with: the cluster's where this
        machine holds it, else the operator's own granted key (gpuprov.identity)."""
        return identity.login_key(self.key)

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def ansible_cfg(self) -> Path:
        return self.dir / "ansible.cfg"

    @property
    def runs(self) -> Path:
        return self.dir / "runs"


@dataclass(frozen=True)
class Plan:
    """What one `up` will do. The provider's plan fills in ``existing`` (the nodes carrying the
    cluster's label); gpuprov.core.counts fills in ``to_create`` and ``min_create`` (the least
    a launch that falls short may bring: `--min-count`)."""

    spec: ClusterSpec
    existing: int
    billable: bool
    to_create: int = 0
    min_create: int = 0
    price_per_node_hour: float | None = None
    # The node-hour's price with its kind, source and date.
    price: Price | None = None
    notes: tuple[str, ...] = ()
    # What the provider prepared for launch (frozen, its own type; None when it needs nothing):
    # carried here, never cached on the provider, so two plans cannot leak into each other; the
    # provider checks its type where it reads it (aws: AwsPlan).
    details: object = None
    # Pull mode (gpuprov.pull.Boot): what each new node gets to bootstrap itself at boot; in a
    # dry run, True where the nodes would pull (the provider's dry run checks its channel too).
    pull: BootArchive | bool | None = None


class BootArchive(Protocol):
    """What a provider that copies pull mode's boot configuration into a node before it starts
    reads of it (gpuprov.pull.Boot, a layer above the providers)."""

    def archive(self, node: str, profile: str | None = None) -> bytes: ...


@dataclass(frozen=True)
class Orphans:
    """What a provider still labels with a cluster's name that no state records."""

    provider: str
    nodes: tuple[NodeRecord, ...]
    # The question and the outcome in words, e.g. "2 docker node(s) carry its label".
    found: str
    removed: str  # e.g. "unrecorded docker node(s) removed"
    region: str | None = None


Reporter = Callable[[str], None]

__all__ = [
    "DEFAULT_PROVIDER", "PROVIDERS", "ClusterFiles", "ClusterSpec", "Orphans", "Plan", "Provider", "ProviderFacts",
    "ProviderOptions", "Reporter", "facts", "flag", "get", "having", "names", "options_for", "options_type",
    "supporting",
]


class Provider(ABC):
    name: str = ""
    # How people call where the nodes are, in messages ("AWS not consulted").
    display_name: str = ""
    billable: bool = False
    # True where reaching the nodes is cheap and certain (hosts that already exist):
    # `up --no-bootstrap` then still runs wait_ready, so every host key is pinned and
    # checked before the cluster is recorded as reachable.
    pins_without_bootstrap: bool = False
    # True where the nodes exist before gpuprov (hosts files): `up` adopts them, --count 0
    # means all of them, and `down` forgets them without touching the machines.
    adopts_existing: bool = False
    # Pull mode: the provider gives the nodes it launches their boot files before first boot.
    pull_at_boot: bool = False
    # True where `image bake --from` must clean the node itself (it cannot clean a copy
    # first): the node is captured and terminated, and leaves its cluster.
    bake_consumes_node: bool = False
    # The provider's own `up` flags (a ProviderOptions subclass in its options module).
    options_type: type[ProviderOptions] = ProviderOptions
    # True where a launch can fall short and still go on (`up --min-count K`: EC2's MinCount).
    partial_launch: bool = False
    # True where a baked image can be copied to other regions (`image bake --copy-to`).
    copies_images: bool = False
    # True where gpuprov can power dynamic Slurm nodes up and down (`--max-count`): a power
    # service of the provider's starts them from the cluster's baked image.
    powers_nodes: bool = False
    # True where the power service runs on the Slurm controller node, not on this machine (aws:
    # under the controller's instance profile), and dynamic nodes boot from an image baked
    # beforehand, not from one of the cluster's nodes (a bake that consumes its node).
    powers_from_controller: bool = False

    def dynamic_image(self, region: str | None, lock_hash: str, cluster: str, instance_type: str) -> str:
        """The image a cluster's dynamic nodes (of ``instance_type``) boot from where
        ``powers_from_controller``; BadInput (one line, nothing made) where there is none."""
        raise NotSupported(f"dynamic nodes from a prepared image are not supported by the {self.name} provider")

    def power_prepare(self, cluster: str, controller: NodeRecord, like: NodeRecord, image: str,
                      disk_gb: int | None, files: ClusterFiles, report: Reporter) -> tuple[Any, Any]:
        """Where ``powers_from_controller``: what the controller's power service needs of the
        provider, made where missing (aws: the launch template, the role and profile on the
        controller), for dynamic nodes made like node ``like``; (what was made, the service's
        plan of a launch)."""
        raise NotSupported(f"a power service on the controller is not supported by the {self.name} provider")
    # True where listing baked images is an API call (aws): `up --image` then lists none.
    images_cost_a_call: bool = False
    # True where the nodes run on this machine and their cluster addresses answer here (local
    # containers): `monitor` then offers no SSH tunnel to Prometheus.
    nodes_on_this_host: bool = False

    # -- checks and plan ------------------------------------------------------------------
    def check_spec(self, spec: ClusterSpec) -> ClusterSpec:
        """The request with this provider's defaults filled in; BadInput (one line, before
        anything is created) for a bad value. Cheap and local: no cloud or engine call. The
        flags it takes are its ``options_type`` (gpuprov.providers.options_for); the counts
        are core's (gpuprov.core.counts)."""
        self.check_type(spec)
        if not isinstance(spec.options, self.options_type):
            raise BadInput(f"the {self.name} provider takes {self.options_type.__name__}, "
                           f"not {type(spec.options).__name__}")
        return spec

    def check_type(self, spec: ClusterSpec) -> None:
        """--type, when given, is one gpuprov knows (BadInput with suggestions otherwise)."""
        if spec.instance_type:
            from gpuprov import catalog  # lazy: CLI start-up

            catalog.get(spec.instance_type)

    @abstractmethod
    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        """Validate the request before anything is created (BadInput), and count what exists:
        the Plan's ``existing`` is how many nodes carry the cluster's label at the provider.
        How many to create (``to_create``, at least ``min_create``) is core's to fill in."""

    def unasked_plan(self, spec: ClusterSpec) -> Plan | None:
        """`up --dry-run`'s plan where the provider cannot be asked from here (aws: no
        credentials): made of what gpuprov carries (the catalog, the bundled prices), its notes
        naming on one line what it could not check, and its dry run asking nothing. None where
        the provider can be asked (the default): plan() and dry_run() then check everything."""
        return None

    def dry_run(self, plan: Plan, report: Reporter) -> None:
        """`up --dry-run`: ask the provider whether this run would be allowed, creating
        nothing. By default there is nothing to ask beyond plan()."""
        return None

    @abstractmethod
    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        """Launch ``plan.to_create`` nodes of ``plan.spec``'s shape (where ``partial_launch``,
        at least ``plan.min_create``), start any of the cluster's nodes that are stopped, and
        answer with every node of the cluster. All-or-nothing: on failure, what this call
        made is removed."""

    @abstractmethod
    def wait_ready(
        self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter
    ) -> list[NodeRecord]:
        """Wait until every node answers SSH with its pinned host key."""

    @abstractmethod
    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        """What exists now, according to the provider (the source of truth)."""

    @abstractmethod
    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        """Remove or forget the cluster's nodes; returns how many were removed."""

    def removal(self, count: int) -> tuple[str, str]:
        """What `down` does, in words: (the question, the past tense)."""
        if self.adopts_existing:
            return (f"forget {count} {self.name} host(s) (the machines are not touched)", "forgotten")
        return (f"remove {count} {self.name} node(s) and their volumes", "removed")

    # -- optional abilities: a provider that has one overrides it ---------------------------
    def supports(self, ability: str) -> bool:
        """Whether this provider overrides the optional method ``ability``."""
        return getattr(type(self), ability) is not getattr(Provider, ability)

    def pull_address(self, spec: ClusterSpec, nodes: list[NodeRecord]) -> str:
        """The address of this machine that the nodes of ``spec`` reach (pull mode serves
        their bootstrap bundle there). ``nodes``: the hosts, once reached (empty when asked
        before anything exists). A provider with ``pull_at_boot`` also hands each node it
        launches ``plan.pull``'s boot configuration; for one without, gpuprov hands it over
        SSH once the hosts answer."""
        raise NotSupported(f"pull mode is not supported by the {self.name} provider")

    def bootstrap_count(self, spec: ClusterSpec) -> int:
        """How many nodes an `up` of ``spec`` bootstraps, as `--bootstrap auto` counts them: its
        --count (a provider that adopts existing hosts counts them)."""
        return spec.count or 0

    def pull_channel_check(self, spec: ClusterSpec, report: Reporter) -> None:
        """What can be checked of the pull channel before anything is created (a provider with
        ``pull_channel``); raises where it cannot serve. Nothing to check by default."""
        del spec, report

    def pull_channel(self, spec: ClusterSpec, report: Reporter) -> Any:
        """Pull mode through the provider's own object store instead of this machine's HTTP
        server (aws: the cluster's S3 bucket, gpuprov/providers/aws/s3.py's Channel): the
        bundle published there, each node's presigned URLs, the reports listed and read.
        gpuprov hands each node its configuration over SSH once it answers."""
        raise NotSupported(f"pull mode through an object store is not supported by the {self.name} provider")

    def terminate_nodes(self, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
        """Remove just these nodes (what one `up` added); returns the ids that would not go."""
        raise NotSupported(f"removing single nodes is not supported by the {self.name} provider")

    def find_orphans(self, name: str, region: str | None) -> Orphans | None:
        """What still carries cluster ``name``'s label though no state records it (None:
        nothing, or the provider is not set up here to look)."""
        raise NotSupported(f"finding clusters by label is not supported by the {self.name} provider")

    def destroy_orphans(self, name: str, orphans: Orphans, report: Reporter) -> int:
        """Remove what find_orphans found; returns how many nodes went."""
        raise NotSupported(f"removing unrecorded clusters is not supported by the {self.name} provider")

    def list_tagged_clusters(self, regions: set[str | None], asked: bool) -> dict[str, dict[str, Any]] | None:
        """Every cluster the provider labels, in ``regions`` ({name: {"nodes", "created",
        "region"}}); None when it is not set up here and was not ``asked`` (by a flag or by
        clusters of its own in state) to look."""
        raise NotSupported(f"listing clusters by label is not supported by the {self.name} provider")

    def baked_images(self, region: str | None = None) -> list[Any]:
        """The images baked with gpuprov here (gpuprov.images.BakedImage each), newest last."""
        raise NotSupported(f"baked images are not supported by the {self.name} provider")

    def bake(self, cluster: Any, node: NodeRecord, files: ClusterFiles, report: Reporter,
             copy_to: tuple[str, ...] = ()) -> Any:
        """Capture ``node`` of ``cluster`` (a ClusterRecord) as an image for the cluster's
        lock, its file system cleaned first (gpuprov/data/bake-clean.sh), and copy it to the
        regions ``copy_to``. The node keeps running as it was, unless ``bake_consumes_node``
        (then it is cleaned itself, captured and terminated). Returns the
        gpuprov.images.BakedImage."""
        raise NotSupported(f"baking images is not supported by the {self.name} provider")

    # -- dynamic Slurm nodes (powers_nodes) ---------------------------------------------------
    def power_address(self) -> str:
        """Where the cluster's power service listens so that its controller reaches it."""
        raise NotSupported(f"dynamic nodes are not supported by the {self.name} provider")

    def power_up(self, cluster: str, node: str, image: str, controller: NodeRecord, munge_key: Path,
                 access: Sequence[Mapping[str, str]] = ()) -> None:
        """Start dynamic node ``node`` of ``cluster`` from ``image``, given the munge key and
        the controller's address (its slurmd fetches its configuration there), the operators'
        keys as the cluster's record has them now (``access``: gpuprov.settings.access_keys;
        the image holds them as they were when it was baked)."""
        raise NotSupported(f"dynamic nodes are not supported by the {self.name} provider")

    def network_nodes(self, nodes: list[NodeRecord], say: Callable[[str], None]) -> dict[str, tuple[str, ...]]:
        """{node name: its network nodes, top layer first} where the provider knows where its
        nodes sit in its network (EC2's instance topology), for Slurm's topology.conf
        (gpuprov.slurm.topology); {} where it does not (the nodes are placed by group or zone)."""
        return {}

    def power_down(self, nodes: list[str]) -> list[str]:
        """Remove dynamic nodes ``nodes``; the names of those that would not go."""
        raise NotSupported(f"dynamic nodes are not supported by the {self.name} provider")

    def power_nodes(self, cluster: str) -> list[str]:
        """The names of ``cluster``'s dynamic nodes that exist now (powered up or booting)."""
        raise NotSupported(f"dynamic nodes are not supported by the {self.name} provider")

    def power_why(self, node: str) -> str:
        """What dynamic node ``node`` last said of its slurmd (why it did not register); ""."""
        return ""

    def image_locks(self, image_ids: set[str], region: str | None = None) -> dict[str, str]:
        """The lock hash each of ``image_ids`` was baked for, where the provider must ask (aws:
        the AMIs' tags); images it does not know, or that are not baked, are left out."""
        raise NotSupported(f"baked images are not supported by the {self.name} provider")

    def delete_image(self, image: Any, report: Reporter) -> None:
        """Remove a baked image (gpuprov.images.BakedImage) and what it holds."""
        raise NotSupported(f"baked images are not supported by the {self.name} provider")

    def host_types(self, spec: ClusterSpec, nodes: list[NodeRecord] | None = None) -> list[Any]:
        """What the cluster's hosts are (catalog.InstanceType each), for its version lock:
        before launch from the request (``nodes`` None), after wait_ready from the nodes.
        A provider whose nodes are all of the requested type says just that."""
        from gpuprov import catalog  # lazy: CLI start-up

        return [catalog.get(spec.instance_type)] if spec.instance_type else []

    def expectations(self, node: NodeRecord) -> dict[str, Any]:
        """What the probes should expect of this node (GPU count, virtualization)."""
        from gpuprov import catalog  # lazy: CLI start-up

        itype = catalog.find(node.instance_type)
        gpus = node.extra.get("gpus")
        if gpus is None and itype is not None:
            gpus = itype.gpu_count
        return {
            "provider": self.name,
            "instance_type": node.instance_type or None,
            "efa": itype.efa if itype else False,
            "infiniband": itype.infiniband if itype else False,
            "gpus": gpus,
            "gpu_model": node.extra.get("gpu_model") or (itype.gpu_model if itype else None),
            "nvswitch": itype.nvswitch if itype else None,
            "virtualization": node.extra.get("virtualization")
            or (itype.virtualization if itype else "unknown"),
        }


def get(name: str) -> Provider:
    module_name = facts(name).module
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            others = [f"--provider {n}" for n in spec.PROVIDERS if n != name]
            raise BadInput(f"provider '{name}' is not available in gpuprov {_version()}; "
                           f"use {' or '.join(others)}") from None
        raise
    provider: Provider = module.PROVIDER
    return provider


def names() -> tuple[str, ...]:
    return tuple(spec.PROVIDERS)


def supporting(ability: str) -> list[Provider]:
    """The providers that have the optional ability ``ability`` (a Provider method name)."""
    return [p for p in (get(n) for n in spec.PROVIDERS) if p.supports(ability)]


def _version() -> str:
    return __version__
