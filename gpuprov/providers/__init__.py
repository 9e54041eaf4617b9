"""Provider interface: a cluster spec in, reachable nodes out, and back.

plan (validate, price, quota) -> launch (idempotent, all-or-nothing) ->
wait_ready (SSH reachable, host keys pinned) -> describe -> terminate.

Inputs and outputs are frozen dataclasses. Providers are looked up by name
and imported lazily, so the CLI never pays for an SDK it does not use.
Providers never import click.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.errors import BadInput
from gpuprov.state import NodeRecord

PROVIDERS: dict[str, str] = {
    "aws": "gpuprov.providers.aws",
    "docker": "gpuprov.providers.docker",
    "static": "gpuprov.providers.static",
}


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    provider: str
    instance_type: str | None
    count: int
    region: str | None = None
    image: str | None = None
    ssh_cidr: str | None = None
    spot: bool = False
    hosts_file: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "count": self.count,
            "region": self.region,
            "image": self.image,
            "ssh_cidr": self.ssh_cidr,
            "spot": self.spot,
            "hosts_file": self.hosts_file,
            "options": dict(self.options),
        }


@dataclass(frozen=True)
class ClusterFiles:
    """Where a cluster's local files live (all under the state dir, 0700)."""

    dir: Path

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

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
    spec: ClusterSpec
    to_create: int
    existing: int
    billable: bool
    price_per_node_hour: float | None = None
    notes: tuple[str, ...] = ()


Reporter = Callable[[str], None]


class Provider(ABC):
    name: str = ""
    billable: bool = False
    # True where reaching the nodes is cheap and certain (hosts that already exist):
    # `up --no-bootstrap` then still runs wait_ready, so every host key is pinned and
    # checked before the cluster is recorded as reachable.
    pins_without_bootstrap: bool = False

    @abstractmethod
    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        """Validate the request before anything is created. Raises BadInput."""

    @abstractmethod
    def launch(self, spec: ClusterSpec, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        """Create what is missing. All-or-nothing: on failure, what this call made is removed."""

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

    def host_types(self, spec: ClusterSpec, nodes: list[NodeRecord] | None = None) -> list[Any]:
        """What the cluster's hosts are (catalog.InstanceType each), for its version lock:
        before launch from the request (``nodes`` None), after wait_ready from the nodes.
        A provider whose nodes are all of the requested type says just that."""
        from gpuprov import catalog

        return [catalog.get(spec.instance_type)] if spec.instance_type else []

    def expectations(self, node: NodeRecord) -> dict[str, Any]:
        """What the probes should expect of this node (GPU count, virtualization)."""
        from gpuprov import catalog

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
    try:
        module_name = PROVIDERS[name]
    except KeyError:
        raise BadInput(f"unknown provider '{name}'; choose one of: {', '.join(sorted(PROVIDERS))}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise BadInput(
                f"provider '{name}' is not available in gpuprov {_version()}; "
                "use --provider docker or --provider static"
            ) from None
        raise
    provider: Provider = module.PROVIDER
    return provider


def _version() -> str:
    from gpuprov import __version__

    return __version__
