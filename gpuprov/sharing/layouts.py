"""Each GPU model's named MIG layouts (gpuprov/data/mig/, one file per model, each with its
source) and the check of a ``--gpu-sharing`` choice against the GPUs of a cluster's hosts:
refused with one line (BadInput) where the GPU has no MIG, where the layout is not one of the
model's, or where gpuprov has no layouts for a MIG GPU."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprov.errors import BadInput
from gpuprov.sharing.choice import Sharing

if TYPE_CHECKING:
    from gpuprov.catalog import InstanceType

_DATA = Path(__file__).parent.parent / "data" / "mig"

# GPUs of gpuprov's catalog without MIG, and MIG GPUs gpuprov has no layouts for yet. Source:
# NVIDIA's Multi-Instance GPU User Guide, "Supported GPUs" (docs.nvidia.com/datacenter/tesla/
# mig-user-guide/): MIG is on the A30, A100, H100, H200 and the Blackwell data center GPUs (B200);
# Volta (V100), Turing (T4) and the GA102 and Ada GPUs (A10G, L4, L40S) have none.
NO_MIG = frozenset({"V100", "T4", "T4G", "A10G", "L4", "L40S"})
MIG_WITHOUT_LAYOUTS = frozenset({"B200"})
# A profile's name (1g.10gb, 1g.10gb+me): the words of the commands a plan holds (gpuprov.sharing.plan).
_PROFILE = re.compile(r"^[1-8]g\.[0-9]{1,3}gb(\+me)?$")
OTHER_WAYS = "it can share with mps (one GPU, no memory isolation) or shard:N (Slurm time-sharing)"


@dataclass(frozen=True)
class Model:
    name: str  # A100-80GB, H200-141GB, ...
    gpu: str  # the catalog's GPU model (A100, H200)
    memory_gib: int  # the catalog's memory per GPU
    pci_device_ids: tuple[str, ...]
    source: str
    # {layout: {profile: GPU instances per GPU}}, in the data file's order.
    layouts: dict[str, dict[str, int]]
    # {profile: (the name some drivers give it, those drivers' branches)}: A100-80GB's 3g.39gb.
    renamed: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)

    def names_of(self, profile: str) -> tuple[str, ...]:
        """The names a driver may report the profile under (the data's own first)."""
        other = self.renamed.get(profile)
        return (profile, other[0]) if other else (profile,)


@lru_cache(maxsize=1)
def models() -> dict[str, Model]:
    """Every model with layouts, by name."""
    found = {}
    for path in sorted(_DATA.glob("*.toml")):
        raw = tomllib.loads(path.read_text())
        found[raw["model"]] = Model(
            name=raw["model"], gpu=raw["gpu"], memory_gib=int(raw["memory_gib"]),
            pci_device_ids=tuple(raw["pci_device_ids"]), source=raw["source"],
            layouts={name: {p: int(n) for p, n in body.items()} for name, body in raw["layouts"].items()},
            renamed={p: (r["name"], tuple(r["drivers"])) for p, r in raw.get("renamed", {}).items()})
        named = {p for body in found[raw["model"]].layouts.values() for p in body}
        named |= {other for other, _ in found[raw["model"]].renamed.values()}
        odd = sorted(p for p in named if not _PROFILE.match(p))
        if odd:
            raise ValueError(f"{path}: not a MIG profile name: {', '.join(odd)}")
    return found


def models_of(gpu: str | None, memory_gib: int = 0) -> list[Model]:
    """The models a host's GPU may be: its catalog model and memory (0: not known, every model of
    that GPU)."""
    return [m for m in models().values() if m.gpu == gpu and (not memory_gib or m.memory_gib == memory_gib)]


def model_by_pci(device_id: str) -> Model | None:
    """The model of a PCI device id (0x2330), where a data file names it."""
    return next((m for m in models().values() if device_id.lower() in m.pci_device_ids), None)


def checked(sharing: Sharing, kinds: list[InstanceType]) -> list[str]:
    """Refuse (BadInput) a sharing some host's GPU cannot have; the notes to record with the lock
    (where a host's GPU model is not known yet)."""
    if sharing.mode in ("none", "mps", "shard"):
        return []
    notes = []
    for itype in kinds:
        if itype.gpu_model is None:
            known = sorted({name for m in models().values() for name in m.layouts})
            if sharing.layout not in known:
                raise BadInput(f"--gpu-sharing mig:{sharing.layout}: no GPU model gpuprov knows has that layout; "
                               f"the layouts: {', '.join(known)}")
            notes.append(f"gpu sharing mig:{sharing.layout}: {itype.name} declares no GPU model: the layout is "
                         "checked against the model the node shows (the gpu_sharing probes, `gpuprov verify`)")
            continue
        notes += _check_model(sharing, itype)
    return notes


def _check_model(sharing: Sharing, itype: InstanceType) -> list[str]:
    gpu = itype.gpu_model
    if gpu in NO_MIG:
        raise BadInput(f"--gpu-sharing mig:{sharing.layout}: {itype.name}'s {gpu} has no MIG (NVIDIA's MIG user "
                       f"guide: A100, H100, H200 and newer data center GPUs); {OTHER_WAYS}")
    candidates = models_of(gpu, itype.gpu_memory_gib)
    if gpu in MIG_WITHOUT_LAYOUTS or not candidates:
        raise BadInput(f"--gpu-sharing mig:{sharing.layout}: gpuprov has no MIG layouts for {itype.name}'s {gpu} "
                       f"yet (gpuprov/data/mig/ lists {', '.join(models())}); {OTHER_WAYS}")
    fits = [m for m in candidates if sharing.layout in m.layouts]
    model = " or ".join(m.name for m in candidates)
    if not fits:
        names = " / ".join(dict.fromkeys(", ".join(m.layouts) for m in candidates))
        raise BadInput(f"--gpu-sharing mig:{sharing.layout}: not a layout of {model} ({itype.name}); "
                       f"its layouts: {names}")
    if len(fits) < len(candidates):  # memory not declared: the node's GPU says which model it is
        return [f"gpu sharing mig:{sharing.layout}: {itype.name}'s {gpu} may be {model}; the layout is "
                f"{', '.join(m.name for m in fits)}'s only: the gpu_sharing probes check the node's GPU"]
    return []


def model_for(sharing: Sharing, gpu: str | None, memory_gib: int = 0) -> Model | None:
    """The model whose layout a MIG sharing names on a host's GPU (memory not known: the first of
    that GPU's models that has the layout); None: not MIG, or no such model."""
    if sharing.mode != "mig":
        return None
    return next((m for m in models_of(gpu, memory_gib) if sharing.layout in m.layouts), None)


def public(sharing: Sharing, itype: InstanceType | None, gpu: str | None) -> dict[str, Any] | None:
    """The lock's sharing as `gpuprov stack -o json` shows it (docs/json-output.md); None for none.
    ``itype``: the lock's catalog type (None: hosts of no single known type); ``gpu``: the lock's
    GPU models."""
    if sharing.mode == "none":
        return None
    model = None
    if sharing.mode == "mig":
        found = models_of(itype.gpu_model if itype else gpu, itype.gpu_memory_gib if itype else 0)
        fits = [m for m in found if sharing.layout in m.layouts]
        model = fits[0] if len(fits) == 1 else None
    return {"mode": sharing.mode, "value": sharing.spelled(), "layout": sharing.layout or None,
            "model": model.name if model else None,
            "instances_per_gpu": dict(model.layouts[sharing.layout]) if model else None,
            "gpus": itype.gpu_count if itype else None,
            "shards_per_gpu": sharing.shards or None}


def role_inputs(sharing: Sharing, itype: InstanceType | None, gpu: str | None) -> dict[str, dict[str, Any]]:
    """What the gpu_sharing role and the slurm role are given for a MIG sharing (the playbooks'
    ``gpuprov_gpu_sharing``): the layout's GPU instances per GPU and {a driver's name: the data's
    name} of its profiles. The lock's catalog type (``itype``) or GPU models (``gpu``) say the
    model; where they do not, every model with the layout counts, and the instances are given only
    where those models agree (all-1g.10gb: 7 on every 80 GB model, 4 on the A100 40 GB: none
    given, and a node whose GPUs have MIG stops, saying so). Empty for mps, shard and none."""
    if sharing.mode != "mig":
        return {"instances": {}, "renamed": {}}
    fits = [m for m in models_of(itype.gpu_model if itype else gpu, itype.gpu_memory_gib if itype else 0)
            if sharing.layout in m.layouts]
    fits = fits or [m for m in models().values() if sharing.layout in m.layouts]
    shapes = {tuple(m.layouts[sharing.layout].items()) for m in fits}
    if len(shapes) != 1:
        return {"instances": {}, "renamed": {}}
    renamed = {other: name for m in fits for name, (other, _) in m.renamed.items()
               if name in m.layouts[sharing.layout]}
    return {"instances": dict(fits[0].layouts[sharing.layout]), "renamed": renamed}


def words(shown: dict[str, Any] | None) -> str:
    """``public``'s answer in a line of the `stack` table."""
    if shown is None:
        return "none"
    if shown["mode"] == "mps":
        return "mps: one MPS control daemon per node; the GPU's memory is not isolated"
    if shown["mode"] == "shard":
        return f"shard:{shown['shards_per_gpu']}: Slurm gres/shard, {shown['shards_per_gpu']} jobs per GPU by time"
    per = shown["instances_per_gpu"]
    if not per:
        return f"{shown['value']} (the node's GPU model decides its instances)"
    each = " + ".join(f"{n} x {p}" for p, n in per.items())
    gpus = shown["gpus"] or 0
    total = f"; {sum(per.values()) * gpus} MIG devices on {gpus} GPUs" if gpus else ""
    return f"{shown['value']}: {each} per {shown['model']}{total}"
