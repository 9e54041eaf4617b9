"""Driver branch policy: the minimum driver per CUDA release and per GPU, each branch's
lifecycle (designation, end of life, source) from ``data/stack.toml``, the default branch
(computed on a given day: the newest long-term branch not past its end of life that serves
the GPUs and CUDA), the kernel module flavour the GPUs need, and the end-of-life warning.
``gpuprov.lock.stack`` builds the lock with these and re-exports them."""

from __future__ import annotations

import tomllib
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuprov import defaults
from gpuprov.errors import BadInput
from gpuprov.lock.lock_data import LockData

_DATA = Path(__file__).parent.parent / "data" / "stack.toml"  # gpuprov/data/

# Minimum driver for each CUDA release.
# Source: CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding
# Driver Versions" (Linux x86_64, "Toolkit Driver Version").
CUDA_MIN_DRIVER = {
    "11.7": "515.43.04",
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.2": "535.54.03",
    "12.8": "570.26",
}

# Minimum driver for each GPU model.
# Source: NVIDIA Data Center GPU Driver release notes, "Hardware supported"
# (H100 and L4 from R525, L40S from R535, H200 from R550, B200 from R570: the branch of
# CUDA 12.8, the first CUDA for sm_100, whose Table 3 minimum is 570.26).
GPU_MIN_DRIVER = {
    "V100": "396.26",
    "T4": "410.48",
    "A100": "450.80.02",
    "A10G": "470.57.02",
    "L4": "525.60.13",
    "L40S": "535.54.03",
    "H100": "525.60.13",
    "H200": "550.54.14",
    "B200": "570.26",
}

# The last driver branch for a GPU model. Source: NVIDIA's Unix driver feature deprecation
# notice: "The release 580 series will be the last to support GPUs based on the Maxwell,
# Pascal, and Volta architectures."
GPU_LAST_BRANCH = {"V100": "580"}

# Kernel module flavours. Source: NVIDIA Driver Installation Guide, "Kernel Modules"
# (docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html): from
# the 515 series two flavours; the open modules support Turing and newer only, Maxwell,
# Pascal and Volta need the proprietary ones; from the 560 series the open flavour is the
# default. NVIDIA's "Transitions Fully Towards Open-Source GPU Kernel Modules" (developer
# blog, 2024): Grace Hopper and Blackwell must use the open modules.
KERNEL_MODULES = defaults.KERNEL_MODULES
OPEN_MODULES_FROM_BRANCH = "515"
OPEN_DEFAULT_FROM_BRANCH = "560"
PROPRIETARY_ONLY_ARCHS = {"sm_70": "Volta"}
OPEN_ONLY_ARCHS = {"sm_100": "Blackwell"}
KERNEL_MODULE_DOC = "NVIDIA Driver Installation Guide, Kernel Modules"
LIFECYCLE_DOC = "NVIDIA Data Center Drivers, Supported Drivers and CUDA Toolkit Versions"
# Fields added with the lifecycle data: absent from locks stored before, and left out of
# the lock hash when empty so that those locks keep their hash.
_LIFECYCLE_FIELDS = ("kernel_module", "driver_branch_kind", "driver_eol")


def today() -> date:
    """The date lifecycle rules are judged on (the system clock; tests pass their own)."""
    return date.today()


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@lru_cache(maxsize=1)
def data() -> dict[str, Any]:
    with _DATA.open("rb") as fh:
        return tomllib.load(fh)


def lifecycle(branch: str | None) -> dict[str, str]:
    """{"kind", "eol", "source"} of a driver branch from the data ({} for one it lacks)."""
    return dict(data()["driver"].get("lifecycle", {}).get(str(branch or ""), {}))


def past_eol(branch: str, on: date | None = None) -> bool:
    """Whether ``branch`` is past its end of life on ``on`` (from the first day of its EOL
    month: NVIDIA gives a month)."""
    eol = lifecycle(branch).get("eol")
    if not eol:
        return False
    year, month = (int(x) for x in eol.split("-"))
    return (on or today()) >= date(year, month, 1)


def pinned_branches(source: str) -> dict[str, str]:
    """Branch -> exact release, as far as package source ``source`` carries them."""
    facts = data()
    branches: dict[str, str] = facts["driver"]["branches"]
    allowed = facts["sources"][source].get("branches")
    return {b: v for b, v in branches.items() if not allowed or b in allowed}


def _branch_fits(branch: str, exact: str, gpus: list[str], cuda: str) -> str | None:
    """Why ``branch`` (at ``exact``) cannot serve these GPUs and CUDA, or None."""
    # A locked CUDA line's own minimum (data/stack.toml's [cuda."X.Y"].min_driver), else the table.
    need = (data().get("cuda", {}).get(cuda) or {}).get("min_driver") or CUDA_MIN_DRIVER.get(cuda)
    if need and _v(exact) < _v(need):
        return f"CUDA {cuda} needs driver >= {need}"
    for gpu in gpus:
        if _v(exact) < _v(GPU_MIN_DRIVER[gpu]):
            return f"{gpu} needs driver >= {GPU_MIN_DRIVER[gpu]}"
        last = GPU_LAST_BRANCH.get(gpu)
        if last and int(branch) > int(last):
            return f"R{last} is the last branch for {gpu}"
    return None


def default_branch(gpus: list[str], cuda: str, source: str, on: date | None = None) -> str:
    """The newest long-term branch, not past its end of life ``on``, pinned for ``source``,
    that serves every GPU model in ``gpus`` and CUDA ``cuda``. The distro source follows the
    distribution: its newest branch, whatever NVIDIA's lifecycle says (``eol_warning`` says
    whose support applies)."""
    pinned = pinned_branches(source)
    if data()["sources"][source].get("branches"):
        return max(pinned, key=int)
    why: list[str] = []
    for branch in sorted(pinned, key=int, reverse=True):
        life = lifecycle(branch)
        if life.get("kind") != "long-term":
            continue
        if past_eol(branch, on):
            why.append(f"R{branch} reached its end of life in {life['eol']}")
            continue
        reason = _branch_fits(branch, pinned[branch], gpus, cuda)
        if reason is None:
            return branch
        why.append(f"R{branch}: {reason}")
    raise BadInput("no long-term driver branch gpuprov pins is supported today and serves "
                   f"{', '.join(gpus) or 'these hosts'} with CUDA {cuda} ({'; '.join(why)}); "
                   "name one with --driver")


def _kernel_module(requested: str | None, archs: list[str], gpus: list[str], branch: str,
                   src: dict[str, Any], source: str) -> str:
    """The kernel module flavour: asked for, where it can work; else the one the GPUs need,
    else open for Turing and newer, else (no GPU known) NVIDIA's default for the branch."""
    if requested is not None and requested not in KERNEL_MODULES:
        raise BadInput(f"unknown kernel module '{requested}'; choose open or proprietary")
    needs_prop = sorted({f"{PROPRIETARY_ONLY_ARCHS[a]} ({a})" for a in archs if a in PROPRIETARY_ONLY_ARCHS})
    needs_open = sorted({f"{OPEN_ONLY_ARCHS[a]} ({a})" for a in archs if a in OPEN_ONLY_ARCHS})
    models = ", ".join(gpus) or "these GPUs"
    if needs_prop and needs_open:
        raise BadInput(f"no kernel module flavour serves {models}: {', '.join(needs_prop)} needs the "
                       f"proprietary modules, {', '.join(needs_open)} the open ones ({KERNEL_MODULE_DOC})")
    allowed = list(src.get("kernel_modules") or ["proprietary"])
    if int(branch) < int(OPEN_MODULES_FROM_BRANCH):
        allowed = [m for m in allowed if m != "open"]
    if needs_prop:
        choice = "proprietary"
        if requested == "open":
            raise BadInput(f"the open kernel modules cannot drive {models}: {', '.join(needs_prop)} "
                           f"needs the proprietary modules; the open ones support Turing and newer "
                           f"only ({KERNEL_MODULE_DOC})")
    elif needs_open:
        choice = "open"
        if requested == "proprietary":
            raise BadInput(f"the proprietary kernel modules cannot drive {models}: "
                           f"{', '.join(needs_open)} needs the open modules ({KERNEL_MODULE_DOC})")
    elif requested is not None:
        choice = requested
    elif archs:
        choice = "open"
    else:
        choice = "open" if int(branch) >= int(OPEN_DEFAULT_FROM_BRANCH) else "proprietary"
    if choice in allowed:
        return choice
    if requested is None and not needs_open and allowed:
        return allowed[0]
    if int(branch) < int(OPEN_MODULES_FROM_BRANCH):
        why = f"driver branch {branch} predates them (from R{OPEN_MODULES_FROM_BRANCH})"
    else:
        why = src.get("open_refused") or "it carries the proprietary ones only"
    raise BadInput(f"package source '{source}' cannot give the {choice} kernel modules"
                   + (f" that {models} needs" if needs_open else "") + f": {why}")


def eol_warning(lock: LockData | None, on: date | None = None) -> str | None:
    """One line when ``lock``'s driver branch is past its end of life ``on`` (default:
    today), naming the branch to move to; None otherwise. For the distro source it says
    whose support applies to the packages."""
    if not lock or not lock.get("driver_branch"):
        return None
    branch = str(lock["driver_branch"])
    if not past_eol(branch, on):
        return None
    life = lifecycle(branch)
    said = (f"driver branch R{branch} ({life.get('kind', 'branch')}) reached its end of life "
            f"in {life['eol']} ({LIFECYCLE_DOC})")
    gpus = [g.strip() for g in (lock.get("gpu") or "").split(",") if g.strip() in GPU_MIN_DRIVER]
    try:
        to = default_branch(gpus, str(lock.get("cuda") or defaults.DEFAULT_CUDA), "nvidia", on)
    except BadInput:
        to = None
    move = ""
    if to is not None:
        nxt = lifecycle(to)
        move = f"; move to R{to} ({nxt['kind']}, until {nxt['eol']})"
    if lock.get("source") == "distro":
        support = data()["sources"]["distro"].get("support", "the distribution")
        return (f"{said}; this cluster's driver comes from the distribution: {support} applies, "
                f"not NVIDIA's" + (move.replace("; move to", "; NVIDIA's packages (--source "
                                                "nvidia): move to") if move else ""))
    return said + move


def eol_field(lock: LockData | None, on: date | None = None) -> str | None:
    """``eol_warning`` (and gpuprov.lock.stack.eol_warning, said for the same locks) as a short field,
    for a command that only reads (status, verify --local): `driver: R535, end of life 2026-06
    (see gpuprov stack)`; None when it has nothing to say."""
    branch = str((lock or {}).get("driver_branch") or "")
    if not branch or not past_eol(branch, on):
        return None
    return f"driver: R{branch}, end of life {lifecycle(branch)['eol']} (see gpuprov stack)"


def fabricmanager_package(src: dict[str, Any], branch: str) -> str | None:
    """Fabric manager's package name in ``src`` for ``branch``: NVIDIA's repositories carry the
    branch in it through R575 (nvidia-fabricmanager-575) and not from R580 (nvidia-fabricmanager)."""
    since = src.get("fabricmanager_unbranched_from")
    if since and src.get("fabricmanager_unbranched") and int(branch) >= int(since):
        return str(src["fabricmanager_unbranched"])
    return src["fabricmanager_package"].format(branch=branch) or None
