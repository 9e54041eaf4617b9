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
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any, cast

from gpuprov import catalog, defaults, platforms
from gpuprov.errors import BadInput
from gpuprov.lock import cuda_lines, drivers, os_lines
from gpuprov.lock.drivers import (  # noqa: F401 (the lock's rules, re-exported: stack.X is the API)
    _LIFECYCLE_FIELDS,
    CUDA_MIN_DRIVER,
    GPU_LAST_BRANCH,
    GPU_MIN_DRIVER,
    KERNEL_MODULES,
    LIFECYCLE_DOC,
    _kernel_module,
    _v,
    data,
    default_branch,
    lifecycle,
    past_eol,
    pinned_branches,
    today,
)
from gpuprov.lock.lock_data import LockData
from gpuprov.lock.stack_choice import StackChoice  # noqa: F401 (stack.StackChoice is the API)
from gpuprov.sharing import choice as sharing_choice
from gpuprov.sharing import layouts as sharing_layouts

SOURCES = defaults.PACKAGE_SOURCES
DEFAULT_CUDA = defaults.DEFAULT_CUDA
DEFAULT_SOURCE = defaults.DEFAULT_SOURCE

# Minimum CUDA for each GPU architecture (compute capability).
# Source: CUDA 11.8 release notes ("adds support for NVIDIA Hopper and Ada
# Lovelace", i.e. sm_90 and sm_89), CUDA 12.8 release notes (adds Blackwell, sm_100
# and sm_120) and the CUDA GPUs compute-capability table. The oldest architecture each
# CUDA line still drives is line data (gpuprov.lock.cuda_lines: CUDA 13 drops Volta and older).
ARCH_MIN_CUDA = {
    "sm_70": "9.0",
    "sm_75": "10.0",
    "sm_80": "11.0",
    "sm_86": "11.1",
    "sm_89": "11.8",
    "sm_90": "11.8",
    "sm_100": "12.8",
    "sm_120": "12.8",
}

# Fields added after locks were first stored: left out of the hash when empty, so a stored
# lock keeps its hash (gpuprov completes it for the plays: gpuprov.settings.complete_lock).
_ADDED_FIELDS = ("dcgm", "dcgm_package", "dcgm_package_version", "dcgm_exporter_image",
                 "nccl_tests", "nccl_tests_sha256", "cuda_archives", "gpu_sharing")


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
    # Added with the lifecycle data: the kernel module flavour ("open" | "proprietary"),
    # the branch's designation ("long-term" | "production" | "feature") and its end of
    # life (YYYY-MM). Locks stored before lack them: their driver packages were the
    # proprietary ones (``flavour``), and the lifecycle comes from the data (``lifecycle``).
    kernel_module: str = ""
    driver_branch_kind: str = ""
    driver_eol: str = ""
    # Added with the dcgm role: DCGM's version (None: the source carries no DCGM), its package
    # and apt version, and dcgm-exporter's image pinned by digest. Left out of the hash when
    # empty (locks stored before keep theirs); gpuprov completes such locks for the plays.
    dcgm: str | None = None
    dcgm_package: str = ""
    dcgm_package_version: str = ""
    dcgm_exporter_image: str = ""
    # nccl-tests (role nccl_tests): its release and the sha256 of its release archive.
    nccl_tests: str | None = None
    nccl_tests_sha256: str = ""
    # A line the artifact mirror serves as NVIDIA's redist archives (packages.cuda_method
    # "archives"): the toolkit's and NCCL's, each {"component", "archive", "sha256", "dir"}
    # (cuDNN's is cudnn_archive). Empty for a line installed from packages.
    cuda_archives: tuple[dict[str, str], ...] = ()
    # The operating system whose packages the lock names (gpuprov.lock.os_lines): debian12 (the
    # default, and every lock stored before there was an OS) is left out of the hash.
    os: str = os_lines.DEFAULT_OS
    # How one GPU serves many jobs (`--gpu-sharing`, gpuprov.sharing): "mig:LAYOUT", "mps", "shard:N",
    # or "" for none (every lock stored before it: left out of the hash when empty).
    gpu_sharing: str = ""

    @property
    def flavour(self) -> str:
        return self.kernel_module or "proprietary"

    def as_dict(self) -> LockData:
        out = asdict(self)
        out["notes"] = list(self.notes)
        out["hash"] = self.short_hash()
        return cast(LockData, out)

    def public(self) -> dict[str, Any]:
        """The `stack` JSON shape of docs/json-output.md (plus the resolved source, branch lifecycle, kernel
        module flavour and lock hash). The lifecycle is read from the data, so a date NVIDIA
        moved shows as it is now."""
        life = lifecycle(self.driver_branch)
        return {
            "instance_type": self.instance_type,
            "gpu": self.gpu,
            "arch": self.arch,
            "driver": self.driver,
            "fabricmanager": self.fabricmanager,
            "cuda": self.cuda,
            "cuda_release": self.cuda_version,
            "cuda_installable": cuda_lines.is_installable(self.cuda, self.source),
            "cudnn": self.cudnn,
            "nccl": self.nccl,
            "efa_installer": self.efa_installer,
            "notes": list(self.notes),
            "driver_branch": self.driver_branch,
            "driver_branch_kind": life.get("kind") or self.driver_branch_kind or None,
            "driver_eol": life.get("eol") or self.driver_eol or None,
            "kernel_module": self.flavour,
            "source": self.source,
            "os": self.os,
            "gpu_sharing": sharing_layouts.public(sharing_choice.of_lock(self.gpu_sharing),
                                                  catalog.find(self.instance_type), self.gpu),
            "hash": self.short_hash(),
            # Not part of the lock (nor its hash): the OS it is proven on here, and those only claimed.
            "platforms": platforms.listing(),
        }

    def short_hash(self) -> str:
        body = {k: v for k, v in asdict(self).items()
                if k != "notes" and not (k in (*_LIFECYCLE_FIELDS, *_ADDED_FIELDS) and not v)
                and not (k == "os" and not os_lines.in_hash(v))}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def resolve(instance_type: str | None, cuda: str | None = None, driver: str | None = None,
            source: str = defaults.DEFAULT_SOURCE, kernel_module: str | None = None,
            on: date | None = None, os: str | None = None, gpu_sharing: str | None = None) -> Lock:
    """The lock for ``instance_type`` (None: hosts of unknown type, no GPU rules apply)."""
    itype = catalog.get(instance_type) if instance_type else catalog.get("docker-node")
    return resolve_types([itype], cuda=cuda, driver=driver, source=source,
                         label=instance_type or "unknown", kernel_module=kernel_module, on=on, os=os,
                         gpu_sharing=gpu_sharing)


def _dcgm(facts: dict[str, Any], source: str, notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stack data's DCGM and its entry for the source (a note where the source has none)."""
    dcgm = facts["dcgm"]
    dcgm_src = dcgm["sources"][source]
    if not dcgm_src["package"]:
        notes.append(f"{source} source: no DCGM package; DCGM {dcgm['version']} and dcgm-exporter "
                     "are installed with --source nvidia or mirror")
    return dcgm, dcgm_src


def resolve_types(types: list[catalog.InstanceType], cuda: str | None = None, driver: str | None = None,
                  source: str = defaults.DEFAULT_SOURCE, label: str | None = None,
                  kernel_module: str | None = None, on: date | None = None, os: str | None = None,
                  gpu_sharing: str | None = None) -> Lock:
    """One lock for every host of a cluster, each described by ``types`` (declared or read
    off its PCI bus): the driver serves every GPU model, CUDA every architecture, fabric
    manager comes with any NVSwitch host and the EFA installer with any EFA host (the plays
    install each only on the hosts that have the hardware). ``on``: the date lifecycle
    rules are judged on (default: today); ``os``: whose packages (None: Debian 12's); ``gpu_sharing``:
    `--gpu-sharing` as typed (None: none), checked against every host's GPU."""
    facts = data()
    if source not in SOURCES:
        raise BadInput(f"unknown package source '{source}'; choose one of: {', '.join(SOURCES)}")
    os = os_lines.checked(os)
    src = os_lines.source(os, source)  # refused here where the OS has no lock of the source
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
    _check_served(kinds)
    sharing = sharing_choice.parse(gpu_sharing)
    notes.extend(sharing_layouts.checked(sharing, kinds))
    cuda = _checked_cuda(kinds, cuda, os, source)
    requested, branch, exact = _checked_driver(gpus, cuda, driver, source, src, os, on, facts["driver"]["branches"])
    module, exact = _module_and_release(kernel_module, archs, gpus, requested, branch, exact, src, source,
                                        facts["driver"]["branches"], notes)
    fabricmanager = _fabricmanager(kinds, nvswitch, src, source, exact, notes)

    pieces = cuda_lines.pieces(cuda, source, label, None if os == os_lines.DEFAULT_OS else os)
    notes.extend(pieces["notes"])
    packages = _packages(src, module, branch, exact, pieces)
    notes.extend(os_lines.source_notes(os, source, src, facts["nccl"]["version"]))
    packages.update(os_lines.nccl_packages(src))
    dcgm, dcgm_src = _dcgm(facts, source, notes)
    life = lifecycle(branch)
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
        cudnn=pieces["cudnn"],
        cudnn_archive=pieces["cudnn_archive"],
        cudnn_archive_sha256=pieces["cudnn_archive_sha256"],
        nccl=pieces["nccl"],
        efa_installer=facts["efa"]["installer"] if efa else None,
        packages=packages,
        notes=tuple(notes),
        efa_installer_sha256=facts["efa"].get("installer_sha256", "") if efa else "",
        aws_ofi_nccl=facts["efa"].get("aws_ofi_nccl") if efa else None,
        gdrcopy=facts.get("gdrcopy", {}).get("version", ""),
        gdrcopy_sha256=facts.get("gdrcopy", {}).get("sha256", ""),
        microcode=dict((src if os_lines.in_hash(os) else facts).get("microcode", {})),
        container_toolkit=facts["container_toolkit"]["version"],
        base_images=tuple(facts["cuda"][cuda].get("base_images", ())),
        site_pip_requirements=tuple(facts["cuda"][cuda].get("site_pip_requirements", ())),
        kernel_module=module,
        driver_branch_kind=life.get("kind", ""),
        driver_eol=life.get("eol", ""),
        dcgm=dcgm["version"] if dcgm_src["package"] else None,
        dcgm_package=dcgm_src["package"],
        dcgm_package_version=dcgm_src["package_version"].format(version=dcgm["version"]),
        dcgm_exporter_image=dcgm["exporter_image"] if dcgm_src["package"] else "",
        nccl_tests=pieces["nccl_tests"],
        nccl_tests_sha256=pieces["nccl_tests_sha256"],
        cuda_archives=tuple(pieces["cuda_archives"]),
        os=os,
        gpu_sharing=sharing.spelled(),
    )


# -- the steps of resolve_types, in its order ------------------------------------------------------
def _check_served(kinds: list[catalog.InstanceType]) -> None:
    """0. What gpuprov can serve at all: x86_64 hosts (the repositories, the container toolkit's,
    microcode and the cuDNN archive it pins are x86_64 ones) with a GPU it has driver facts for."""
    for itype in kinds:
        if itype.cpu_arch != "x86_64":
            raise BadInput(f"{itype.name} is an {itype.cpu_arch} type: gpuprov pins x86_64 packages "
                           "only (NVIDIA's repositories, the container toolkit, microcode, the cuDNN "
                           "archive); choose an x86_64 type")
        if itype.gpu_model and itype.gpu_model not in GPU_MIN_DRIVER:
            raise BadInput(f"gpuprov has no driver facts for {itype.gpu_model} ({itype.name}); "
                           f"it knows {', '.join(sorted(GPU_MIN_DRIVER))}")


def _checked_cuda(kinds: list[catalog.InstanceType], cuda: str | None, os: str, source: str) -> str:
    """1. CUDA against every GPU architecture: the first CUDA for it, then the line's range;
    the line as spelled in the data (the OS's default when none is asked for)."""
    cuda = cuda_lines.spelled(cuda or os_lines.default_cuda(os, source), os)
    for itype in kinds:
        if itype.arch is None:
            continue
        need = ARCH_MIN_CUDA[itype.arch]
        if _v(cuda) < _v(need):
            raise BadInput(
                f"CUDA {cuda} cannot drive {itype.gpu_model} ({itype.arch}) on {itype.name}: "
                f"{itype.arch} needs CUDA >= {need} (CUDA release notes: the first CUDA for "
                f"{itype.arch} is {need}){cuda_lines.way_forward(itype.arch, cuda)}"
            )
    cuda_lines.line(cuda)  # refused here when the data lacks the line
    for itype in kinds:
        why = itype.arch and cuda_lines.arch_reason(cuda, itype.arch)
        if why and itype.arch:
            raise BadInput(f"CUDA {cuda} cannot drive {itype.gpu_model} ({itype.arch}, "
                           f"{cuda_lines.family(itype.arch)}) on {itype.name}: {why}"
                           f"{cuda_lines.way_forward(itype.arch, cuda)}")
    refused = (os_lines.cuda_refusal(cuda, os, source, cuda_lines.line(cuda))
               or cuda_lines.source_refusal(cuda, source))
    if refused:
        raise BadInput(refused)
    return cuda


def _checked_driver(gpus: list[str], cuda: str, driver: str | None, source: str, src: dict[str, Any], os: str,
                    on: date | None, branches: dict[str, str]) -> tuple[str, str, str]:
    """2. Driver: the requested branch or exact version, else the default branch (computed),
    held to the CUDA line's minimum, every GPU's and the source's branches: (requested, branch,
    exact release)."""
    own_branches = src.get("branches") if os_lines.in_hash(os) else None
    requested = driver or (max(own_branches, key=int) if own_branches else default_branch(gpus, cuda, source, on))
    branch = requested.split(".")[0]
    exact = requested if "." in requested else branches.get(branch)
    if exact is None:
        # A branch gpuprov has no pinned release for: still check the rules first,
        # so an impossible request is refused with its reason.
        exact = f"{branch}.0.0"
    need_cuda = cuda_lines.min_driver(cuda)
    if _v(exact) < _v(need_cuda):
        raise BadInput(
            f"driver {requested} is too old for CUDA {cuda}: CUDA {cuda} needs driver >= "
            f"{need_cuda} (CUDA Toolkit release notes, Table 3)"
        )
    for gpu in sorted(gpus, key=lambda g: _v(GPU_MIN_DRIVER[g]), reverse=True)[:1]:
        # The GPU that needs the newest driver decides for every host.
        if _v(exact) < _v(GPU_MIN_DRIVER[gpu]):
            raise BadInput(
                f"driver {requested} does not support {gpu}: it needs driver >= "
                f"{GPU_MIN_DRIVER[gpu]} (NVIDIA data center driver release notes)"
            )
    for gpu in gpus:
        last = GPU_LAST_BRANCH.get(gpu)
        if last and int(branch) > int(last):
            raise BadInput(f"driver {requested} does not support {gpu}: R{last} is its last branch "
                           "(NVIDIA: the 580 series is the last for Maxwell, Pascal and Volta)")
    if branch not in branches:
        raise BadInput(f"gpuprov pins no release of driver branch {branch} "
                       f"(pinned: {', '.join(sorted(branches, key=int))})")
    allowed = src.get("branches")
    if allowed and branch not in allowed:
        raise BadInput(os_lines.branch_refusal(os, source, allowed, branch))
    return requested, branch, exact


def _module_and_release(kernel_module: str | None, archs: list[str], gpus: list[str], requested: str, branch: str,
                        exact: str, src: dict[str, Any], source: str, branches: dict[str, str],
                        notes: list[str]) -> tuple[str, str]:
    """3. The kernel module flavour, from the GPUs' architecture (no GPU: the OS's default, if
    any), and the release: the branch's pin, or an earlier release of it asked for by name."""
    kernel_module = kernel_module or (None if archs else src.get("default_kernel_module"))
    module = _kernel_module(kernel_module, archs, gpus, branch, src, source)
    earlier = src.get("earlier_releases", {}).get(branch, [])
    if "." in requested and requested != branches[branch] and requested not in earlier:
        raise BadInput(f"driver {requested} is not the release gpuprov pins for branch {branch} "
                       f"({', '.join([branches[branch], *earlier])} with source {source}); ask for "
                       f"the branch ({branch}) instead")
    if requested in earlier:
        exact = requested
        notes.append(f"driver {requested}: an earlier release than branch {branch}'s pin "
                     f"{branches[branch]} (a rollback: it lacks the pin's fixes)")
    return module, exact


def _fabricmanager(kinds: list[catalog.InstanceType], nvswitch: bool, src: dict[str, Any], source: str, exact: str,
                   notes: list[str]) -> str | None:
    """4. Fabric manager: on NVSwitch systems, exactly the driver's version (NVIDIA Fabric
    Manager user guide: "the versions must match", else CUDA_ERROR_SYSTEM_NOT_READY, error 802)."""
    if not nvswitch:
        return None
    if not src["fabricmanager_package"]:
        switched = ", ".join(t.name for t in kinds if t.nvswitch)
        raise BadInput(f"{switched} has NVSwitch and needs fabric manager, which package "
                       f"source '{source}' does not carry; use --source nvidia or mirror")
    notes.append(f"NVSwitch: fabric manager pinned to driver {exact}")
    return exact


def _packages(src: dict[str, Any], module: str, branch: str, exact: str, pieces: dict[str, Any]) -> dict[str, Any]:
    """5. The packages of the lock: the driver's flavour at the exact release, fabric manager's,
    CUDA's pieces, and NVIDIA's own version lock where the source has it for the branch."""
    names_key = "driver_packages_open" if module == "open" else "driver_packages"
    pin_from = src.get("pinning_from_branch")
    packages = {
        "driver": [p.format(branch=branch) for p in src[names_key]],
        "driver_version": src["driver_version"].format(version=exact),
        "fabricmanager": drivers.fabricmanager_package(src, branch),
        "fabricmanager_version": src["fabricmanager_version"].format(version=exact) or None,
        **pieces["packages"],
    }
    if src.get("pinning_package") and pin_from and int(branch) >= int(pin_from):
        # NVIDIA's own version lock (installed before the driver): this exact release.
        packages["pinning"] = src["pinning_package"].format(branch=branch, version=exact)
    return packages


def eol_warning(lock: LockData | None, on: date | None = None) -> str | None:
    """One line when ``lock``'s driver branch is past its end of life (gpuprov.lock.drivers.eol_warning;
    for a distro lock of another OS than Debian 12, that OS's support: gpuprov.lock.os_lines)."""
    if not lock:
        return None
    return os_lines.eol_warning(lock, on) or drivers.eol_warning(lock, on)


def kinds_of(lock: LockData) -> list[catalog.InstanceType]:
    """The hosts a stored lock was resolved for, as far as it matters to a lock (GPU models,
    NVSwitch, EFA), rebuilt from the lock itself: a lock of hosts that declared nothing, or of
    a mixed cluster, names no single catalog type."""
    name = lock.get("instance_type") or "unknown"
    known = catalog.find(name)
    if known is not None:
        return [known]
    models: list[str | None] = [g.strip() for g in (lock.get("gpu") or "").split(",") if g.strip()] or [None]
    return [catalog.InstanceType(
        name=name, provider="onprem", gpu_model=model, gpu_count=0, gpu_memory_gib=0,
        arch=catalog.ARCH_BY_GPU.get(model or ""), vcpus=None, memory_gib=None,
        efa=lock.get("efa_installer") is not None, efa_max_interfaces=0, network_cards=1,
        nvswitch=bool(lock.get("nvswitch")), virtualization="unknown") for model in models]


def from_dict(raw: LockData) -> Lock:
    body: dict[str, Any] = {k: v for k, v in raw.items() if k != "hash"}
    body["notes"] = tuple(body.get("notes", ()))
    body["base_images"] = tuple(body.get("base_images", ()))
    body["site_pip_requirements"] = tuple(body.get("site_pip_requirements", ()))
    body["cuda_archives"] = tuple(body.get("cuda_archives", ()))
    return Lock(**body)

