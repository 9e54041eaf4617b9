"""The version lock: which driver, fabric manager, CUDA, cuDNN, NCCL and EFA
installer a cluster gets, resolved once and then the same on every node and
every re-run.

Facts (exact versions, package names per source) are data, in
``gpuprov/data/stack.toml``. The rules that combine them are here, each with
the document it comes from. An impossible request is refused with the rule
that forbids it (``BadInput``).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuprov import catalog
from gpuprov.errors import BadInput

_DATA = Path(__file__).parent / "data" / "stack.toml"
SOURCES = ("nvidia", "distro", "mirror")

# Minimum driver for each CUDA release.
# Source: CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding
# Driver Versions" (Linux x86_64, "Toolkit Driver Version").
CUDA_MIN_DRIVER = {
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.2": "535.54.03",
}

# Minimum CUDA for each GPU architecture (compute capability).
# Source: CUDA 11.8 release notes ("adds support for NVIDIA Hopper and Ada
# Lovelace", i.e. sm_90 and sm_89) and the CUDA GPUs compute-capability table.
ARCH_MIN_CUDA = {
    "sm_70": "9.0",
    "sm_75": "10.0",
    "sm_80": "11.0",
    "sm_86": "11.1",
    "sm_89": "11.8",
    "sm_90": "11.8",
}

# Minimum driver for each GPU model.
# Source: NVIDIA Data Center GPU Driver release notes, "Hardware supported"
# (H100 and L4 from R525, L40S from R535, H200 from R550).
GPU_MIN_DRIVER = {
    "V100": "396.26",
    "T4": "410.48",
    "A100": "450.80.02",
    "A10G": "470.57.02",
    "L4": "525.60.13",
    "L40S": "535.54.03",
    "H100": "525.60.13",
    "H200": "550.54.14",
}


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@lru_cache(maxsize=1)
def data() -> dict[str, Any]:
    with _DATA.open("rb") as fh:
        return tomllib.load(fh)


@dataclass(frozen=True)
class Lock:
    instance_type: str
    gpu: str | None
    arch: str | None
    nvswitch: bool
    source: str
    driver_branch: str
    driver: str
    fabricmanager: str | None
    cuda: str
    cuda_version: str
    cudnn: str
    cudnn_archive: str
    cudnn_archive_sha256: str
    nccl: str
    efa_installer: str | None
    packages: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # Added with the rdma and microcode roles; locks stored before them lack these
    # fields, so plays read them with `| default(...)`.
    efa_installer_sha256: str = ""
    aws_ofi_nccl: str | None = None
    gdrcopy: str = ""
    gdrcopy_sha256: str = ""
    microcode: dict[str, str] = field(default_factory=dict)
    # Added with the container roles (container_runtime, base_images): plays read them
    # with `| default(...)` for locks stored before.
    container_toolkit: str = ""
    # Each pinned by digest: "repo:tag@sha256:..." (the tag for people).
    base_images: tuple[str, ...] = ()
    # The site image's pip requirements, each "NAME==VERSION --hash=sha256:..." (pip
    # --require-hashes); added with digest pinning, read with `| default([])`.
    site_pip_requirements: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["hash"] = self.short_hash()
        return out

    def public(self) -> dict[str, Any]:
        """DESIGN.md's `stack` JSON shape (plus the resolved source and lock hash)."""
        return {
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "arch": self.arch,
            "driver": self.driver,
            "fabricmanager": self.fabricmanager,
            "cuda": self.cuda,
            "cudnn": self.cudnn,
            "nccl": self.nccl,
            "efa_installer": self.efa_installer,
            "notes": list(self.notes),
            "driver_branch": self.driver_branch,
            "source": self.source,
            "hash": self.short_hash(),
        }

    def short_hash(self) -> str:
        body = {k: v for k, v in asdict(self).items() if k != "notes"}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def default_source(provider: str) -> str:
    """Cloud images (Ubuntu) use NVIDIA's repositories; local Debian nodes use Debian's."""
    return "distro" if provider == "docker" else "nvidia"


def resolve(instance_type: str | None, cuda: str = "11.8", driver: str | None = None,
            source: str = "nvidia") -> Lock:
    """The lock for ``instance_type`` (None: hosts of unknown type, no GPU rules apply)."""
    itype = catalog.get(instance_type) if instance_type else catalog.get("docker-node")
    return resolve_types([itype], cuda=cuda, driver=driver, source=source,
                         label=instance_type or "unknown")


def resolve_types(types: list[catalog.InstanceType], cuda: str = "11.8", driver: str | None = None,
                  source: str = "nvidia", label: str | None = None) -> Lock:
    """One lock for every host of a cluster, each described by ``types`` (declared or read
    off its PCI bus): the driver serves every GPU model, CUDA every architecture, fabric
    manager comes with any NVSwitch host and the EFA installer with any EFA host (the plays
    install each only on the hosts that have the hardware)."""
    facts = data()
    if source not in SOURCES:
        raise BadInput(f"unknown package source '{source}'; choose one of: {', '.join(SOURCES)}")
    kinds = list({t.name: t for t in types}.values()) or [catalog.get("docker-node")]
    names = ", ".join(t.name for t in kinds)
    label = label or names
    gpus = sorted({t.gpu_model for t in kinds if t.gpu_model})
    archs = sorted({t.arch for t in kinds if t.arch})
    nvswitch = any(t.nvswitch for t in kinds)
    efa = any(t.efa for t in kinds)
    notes: list[str] = []
    if len(kinds) > 1:
        notes.append(f"one lock for hosts of {len(kinds)} kinds: {names}")

    # 1. CUDA against every GPU architecture.
    for itype in kinds:
        if itype.arch is None:
            continue
        need = ARCH_MIN_CUDA[itype.arch]
        if _v(cuda) < _v(need):
            raise BadInput(
                f"CUDA {cuda} cannot drive {itype.gpu_model} ({itype.arch}) on {itype.name}: "
                f"{itype.arch} needs CUDA >= {need} (CUDA 11.8 release notes: Hopper/Ada support)"
            )
    if cuda not in facts["cuda"]:
        known = ", ".join(sorted(facts["cuda"]))
        raise BadInput(f"gpuprov's stack data has no CUDA {cuda} (available: {known})")

    # 2. Driver: requested branch or exact version, else the default branch.
    branches: dict[str, str] = facts["driver"]["branches"]
    requested = driver or facts["driver"]["default_branch"]
    branch = requested.split(".")[0]
    exact = requested if "." in requested else branches.get(branch)
    if exact is None:
        # A branch gpuprov has no pinned release for: still check the rules first,
        # so an impossible request is refused with its reason.
        exact = f"{branch}.0.0"
    need_cuda = CUDA_MIN_DRIVER[cuda]
    if _v(exact) < _v(need_cuda):
        raise BadInput(
            f"driver {requested} is too old for CUDA {cuda}: CUDA {cuda} needs driver >= "
            f"{need_cuda} (CUDA Toolkit release notes, Table 3)"
        )
    for gpu in sorted(gpus, key=lambda g: _v(GPU_MIN_DRIVER[g]), reverse=True)[:1]:
        # The GPU that needs the newest driver decides for every host.
        if _v(exact) >= _v(GPU_MIN_DRIVER[gpu]):
            continue
        if driver is None:
            # The default branch is too old for this GPU: take the oldest pinned branch that works.
            fits = [b for b in sorted(branches, key=int)
                    if _v(branches[b]) >= _v(GPU_MIN_DRIVER[gpu])]
            branch, exact = fits[0], branches[fits[0]]
            notes.append(f"{gpu} needs driver >= {GPU_MIN_DRIVER[gpu]}: branch {branch}")
        else:
            raise BadInput(
                f"driver {requested} does not support {gpu}: it needs driver >= "
                f"{GPU_MIN_DRIVER[gpu]} (NVIDIA data center driver release notes)"
            )
    if branch not in branches:
        raise BadInput(f"gpuprov pins no release of driver branch {branch} "
                       f"(pinned: {', '.join(sorted(branches, key=int))})")
    if "." in requested and requested != branches[branch]:
        raise BadInput(f"driver {requested} is not the release gpuprov pins for branch {branch} "
                       f"({branches[branch]}); ask for the branch ({branch}) instead")

    src = facts["sources"][source]
    allowed = src.get("branches")
    if allowed and branch not in allowed:
        raise BadInput(
            f"package source '{source}' carries driver branch {', '.join(allowed)} only, "
            f"not {branch}; use --source nvidia or mirror"
        )

    # 3. Fabric manager: on NVSwitch systems, exactly the driver's version
    # (NVIDIA Fabric Manager user guide: "the versions must match", else
    # CUDA_ERROR_SYSTEM_NOT_READY, error 802).
    fabricmanager = exact if nvswitch else None
    if nvswitch and not src["fabricmanager_package"]:
        switched = ", ".join(t.name for t in kinds if t.nvswitch)
        raise BadInput(f"{switched} has NVSwitch and needs fabric manager, which package "
                       f"source '{source}' does not carry; use --source nvidia or mirror")
    if nvswitch:
        notes.append(f"NVSwitch: fabric manager pinned to driver {exact}")

    cudnn = facts["cudnn"]
    packages = {
        "driver": [p.format(branch=branch) for p in src["driver_packages"]],
        "driver_version": src["driver_version"].format(version=exact),
        "fabricmanager": src["fabricmanager_package"].format(branch=branch) or None,
        "fabricmanager_version": src["fabricmanager_version"].format(version=exact) or None,
        "cuda": src["cuda_package"],
        "cuda_version": src["cuda_version"],
        "cudnn": list(src["cudnn_packages"]),
        "cudnn_version": src["cudnn_version"],
        "cudnn_method": src["cudnn_method"],
    }
    if source == "distro":
        notes.append("Debian's archive keeps only its newest 535 release: the lock fails loudly "
                     "if that moves, instead of drifting")
    return Lock(
        instance_type=label,
        gpu=", ".join(gpus) or None,
        arch=", ".join(archs) or None,
        nvswitch=nvswitch,
        source=source,
        driver_branch=branch,
        driver=exact,
        fabricmanager=fabricmanager,
        cuda=cuda,
        cuda_version=facts["cuda"][cuda]["distro_version" if source == "distro" else "version"],
        cudnn=cudnn["version"],
        cudnn_archive=cudnn["archive"],
        cudnn_archive_sha256=cudnn["archive_sha256"],
        nccl=facts["nccl"]["version"],
        efa_installer=facts["efa"]["installer"] if efa else None,
        packages=packages,
        notes=tuple(notes),
        efa_installer_sha256=facts["efa"].get("installer_sha256", "") if efa else "",
        aws_ofi_nccl=facts["efa"].get("aws_ofi_nccl") if efa else None,
        gdrcopy=facts.get("gdrcopy", {}).get("version", ""),
        gdrcopy_sha256=facts.get("gdrcopy", {}).get("sha256", ""),
        microcode=dict(facts.get("microcode", {})),
        container_toolkit=facts["container_toolkit"]["version"],
        base_images=tuple(facts["cuda"][cuda].get("base_images", ())),
        site_pip_requirements=tuple(facts["cuda"][cuda].get("site_pip_requirements", ())),
    )


def kinds_of(lock: dict[str, Any]) -> list[catalog.InstanceType]:
    """The hosts a stored lock was resolved for, as far as it matters to a lock (GPU models,
    NVSwitch, EFA), rebuilt from the lock itself: a lock of hosts that declared nothing, or of
    a mixed cluster, names no single catalog type."""
    name = lock.get("instance_type") or "unknown"
    known = catalog.find(name)
    if known is not None:
        return [known]
    models = [g.strip() for g in (lock.get("gpu") or "").split(",") if g.strip()] or [None]
    return [catalog.InstanceType(
        name=name, provider="onprem", gpu_model=model, gpu_count=0, gpu_memory_gib=0,
        arch=catalog.ARCH_BY_GPU.get(model or ""), vcpus=None, memory_gib=None,
        efa=lock.get("efa_installer") is not None, efa_max_interfaces=0, network_cards=1,
        nvswitch=bool(lock.get("nvswitch")), virtualization="unknown") for model in models]


def from_dict(raw: dict[str, Any]) -> Lock:
    body = {k: v for k, v in raw.items() if k != "hash"}
    body["notes"] = tuple(body.get("notes", ()))
    body["base_images"] = tuple(body.get("base_images", ()))
    body["site_pip_requirements"] = tuple(body.get("site_pip_requirements", ()))
    return Lock(**body)
