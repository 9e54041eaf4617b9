"""What a health check holds a node to (``Expect``) and what the node showed (``Facts``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any

from gpuprov import catalog
from gpuprov.health import parse
from gpuprov.health.gather import Section
from gpuprov.lock.lock_data import LockData


@lru_cache(maxsize=1)
def nvlink_table() -> dict[str, int]:
    """NVLink links per GPU by instance type (the catalog's nvlink_links_per_gpu, with its
    sources). Read as the package's resource: the same from a checkout, a wheel or the node's
    zipapp (gpuprov.health.node_bundle)."""
    raw = json.loads(resources.files(catalog).joinpath("instance_types.json").read_text(encoding="utf-8"))
    return {k: int(v) for k, v in raw.get("nvlink_links_per_gpu", {}).items() if not k.startswith("_")}


@dataclass(frozen=True)
class Expect:
    """A node's expectations: its type's catalog facts, or what the user declared, and the
    cluster's version lock."""

    instance_type: str | None = None
    gpus: int | None = None
    gpu_model: str | None = None
    nvswitch: bool | None = None
    efa_interfaces: int = 0
    lock: LockData | None = None
    # How a user brings the node back to what gpuprov set (`gpuprov provision NAME`).
    provision: str = "gpuprov provision NAME"

    @property
    def kind(self) -> str:
        return self.instance_type or "this node"

    @property
    def nvlink_per_gpu(self) -> int | None:
        """The links each GPU must have up; None where the type is not in the table."""
        return nvlink_table().get(self.instance_type or "")

    @classmethod
    def of(cls, seen: dict[str, Any], lock: LockData | None, provision: str) -> Expect:
        """From a provider's expectations of a node (Provider.expectations) and the lock."""
        itype = catalog.find(seen.get("instance_type"))
        efa = itype.efa_max_interfaces if itype is not None and itype.efa else 0
        gpus = seen.get("gpus")
        return cls(instance_type=seen.get("instance_type"), gpus=None if gpus in (None, "") else int(gpus),
                   gpu_model=seen.get("gpu_model"), nvswitch=seen.get("nvswitch"), efa_interfaces=efa,
                   lock=lock, provision=provision)


class Facts:
    """A node's gathered sections, parsed on first use."""

    def __init__(self, sections: dict[str, Section]) -> None:
        self.sections = sections

    def text(self, name: str) -> str:
        section = self.sections.get(name)
        return section.text if section is not None else ""

    def rc(self, name: str) -> int | None:
        section = self.sections.get(name)
        return section.rc if section is not None else None

    @cached_property
    def container(self) -> str | None:
        kind = self.text("container").strip()
        return kind if kind and kind != "none" else None

    @cached_property
    def bus(self) -> dict[str, Any]:
        return catalog.parse_pci(self.text("pci"))

    @property
    def gpus_on_bus(self) -> int:
        return len(self.bus["gpu_device_ids"])

    @property
    def nvswitches(self) -> int:
        return int(self.bus["nvswitches"])

    @cached_property
    def smi(self) -> tuple[list[dict[str, str]], list[str]]:
        return parse.query_csv(self.text("smi_ids"))

    @cached_property
    def q(self) -> dict[str, parse.Tree]:
        return parse.smi_q(self.text("smi_q"))

    @property
    def root(self) -> bool:
        return self.text("uid").strip() == "0"
