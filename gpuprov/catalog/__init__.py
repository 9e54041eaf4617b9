"""Instance-type facts: GPUs, architecture, EFA, NVSwitch, price estimate.

The bundled table (``instance_types.json``) is the reviewed source for what
EC2's DescribeInstanceTypes does not say (NVSwitch, compute capability,
price). Loaded lazily, once per process.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuprov.errors import BadInput

_DATA = Path(__file__).with_name("instance_types.json")


@dataclass(frozen=True)
class InstanceType:
    name: str
    provider: str
    gpu_model: str | None
    gpu_count: int
    gpu_memory_gib: int
    arch: str | None
    vcpus: int | None
    memory_gib: int | None
    efa: bool
    efa_max_interfaces: int
    network_cards: int
    nvswitch: bool
    virtualization: str
    quota_code: str | None = None
    price: dict[str, float] = field(default_factory=dict)

    def price_per_hour(self, region: str | None) -> float | None:
        if region is None:
            return None
        return self.price.get(region)

    def row(self) -> dict[str, Any]:
        return {
            "instance_type": self.name,
            "provider": self.provider,
            "gpu": self.gpu_model,
            "gpus": self.gpu_count,
            "gpu_memory_gib": self.gpu_memory_gib,
            "arch": self.arch,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "efa": self.efa,
            "efa_interfaces": self.efa_max_interfaces,
            "nvswitch": self.nvswitch,
            "price_us_east_1": self.price.get("us-east-1"),
        }


@lru_cache(maxsize=1)
def _load() -> tuple[str, dict[str, InstanceType]]:
    raw = json.loads(_DATA.read_text())
    types = {name: InstanceType(name=name, **facts) for name, facts in raw["types"].items()}
    return raw["price_date"], types


def price_date() -> str:
    return _load()[0]


def all_types() -> list[InstanceType]:
    return sorted(_load()[1].values(), key=lambda t: (t.provider, t.name))


def get(name: str) -> InstanceType:
    types = _load()[1]
    try:
        return types[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(types), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `gpuprov types` lists them"
        raise BadInput(f"unknown instance type '{name}'{hint}") from None


def find(name: str | None) -> InstanceType | None:
    """Like ``get`` but ``None`` for unknown or absent names (static hosts)."""
    if not name:
        return None
    return _load()[1].get(name)


def by_gpu(model: str | None) -> list[InstanceType]:
    types = all_types()
    if model is None:
        return types
    want = model.lower()
    return [t for t in types if t.gpu_model and t.gpu_model.lower() == want]
