"""The lock's operating system (``os``): Debian 12 (the default), Debian 13 (trixie) or Ubuntu 24.04
(noble, claimed: NVIDIA's repository names read off its public documents), each with the package
facts of ``data/stack.toml`` — Debian 12's in [sources.*], every other OS's in [os.X.sources.S] —
and the rules that tie an OS to a package source and a CUDA line.

A Debian 12 lock records ``os`` but leaves it out of its hash (``in_hash``), so that every lock
stored before there was an OS keeps its hash. Which OS the suite proves: gpuprov.platforms.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from gpuprov import defaults
from gpuprov.errors import BadInput
from gpuprov.lock.drivers import LIFECYCLE_DOC, data, lifecycle, past_eol
from gpuprov.lock.lock_data import LockData

DEFAULT_OS = defaults.DEFAULT_OS


def names() -> list[str]:
    """Every OS a lock can name, the default first."""
    return [DEFAULT_OS, *sorted(data().get("os", {}))]


def facts(os: str) -> dict[str, Any]:
    """The data of ``os`` ({} for the default, whose facts are [sources.*])."""
    return dict(data().get("os", {}).get(os, {})) if os != DEFAULT_OS else {}


def checked(os: str | None) -> str:
    """``os`` as a lock records it (None: the default); BadInput for one the data lacks."""
    os = os or DEFAULT_OS
    if os not in names():
        raise BadInput(f"--os {os}: gpuprov's stack data has no facts for it (known: {', '.join(names())})")
    return os


def source(os: str, name: str) -> dict[str, Any]:
    """The package facts of source ``name`` on ``os`` (the fields of [sources.*]); BadInput,
    one line, where the OS has no lock of that source."""
    if os == DEFAULT_OS:
        return dict(data()["sources"][name])
    own = facts(os)
    why = (own.get("refused") or {}).get(name)
    if why:
        raise BadInput(f"--os {os} with package source '{name}': {why}")
    found = (own.get("sources") or {}).get(name)
    if found is None:
        raise BadInput(f"--os {os}: gpuprov has no package names of package source '{name}' for it")
    return dict(found)


def default_cuda(os: str, name: str) -> str:
    """The CUDA line a lock of ``os`` and source ``name`` gets without --cuda: the default line,
    or the OS's own where its archive carries another (Debian 13: 12.4)."""
    own = (facts(os).get("sources") or {}).get(name) or {}
    return (own.get("cuda_lines") or [defaults.DEFAULT_CUDA])[0]


def cuda_refusal(cuda: str, os: str, name: str, line: dict[str, Any]) -> str | None:
    """Why line ``cuda`` (its facts ``line``) gives no lock on ``os`` with source ``name``, or None."""
    only = line.get("os")
    if only and os not in only:
        return (f"CUDA {cuda} is packaged by {', '.join(facts(o).get('title', o) for o in only)} only: "
                f"use --os {only[0]} --source distro, or --cuda {default_cuda(os, name)}")
    carried = ((facts(os).get("sources") or {}).get(name) or {}).get("cuda_lines")
    if carried and cuda not in carried:
        title = facts(os).get("title", os)
        whose = f"{title}'s archive" if name == "distro" else f"NVIDIA's repository for {title}"
        if name == "mirror":
            whose = f"the mirror (NVIDIA's layout) for {title}"
        return (f"CUDA {cuda} with --os {os} --source {name}: {whose} packages CUDA "
                f"{', '.join(carried)} only; use --cuda {carried[0]}")
    return None


def source_notes(os: str, name: str, src: dict[str, Any], nccl: str) -> list[str]:
    """What a lock of ``os`` and source ``name`` (its facts ``src``) says of its packages
    (``nccl``: the NCCL NVIDIA's repository gives, for a distro that has none)."""
    notes = list(src.get("notes", ())) if in_hash(os) else []
    if name != "distro":
        return notes
    if not in_hash(os):
        notes.append("Debian's archive keeps only its newest 535 release: the lock fails loudly "
                     "if that moves, instead of drifting")
    notes.append(f"distro source: {src.get('support', 'the distribution')} applies to these "
                 "packages, not NVIDIA's branch lifecycle")
    if not src.get("nccl_packages"):
        notes.append(f"distro source: Debian's archive has no NCCL; NCCL {nccl} "
                     "is installed with --source nvidia or mirror")
    return notes


def nccl_packages(src: dict[str, Any]) -> dict[str, Any]:
    """The lock's NCCL package names and version where the source's own archive carries NCCL
    (Debian 13: libnccl2); {} where it does not (Debian 12), so those locks keep their hash."""
    if not src.get("nccl_packages"):
        return {}
    return {"nccl": list(src["nccl_packages"]), "nccl_version": src["nccl_version"]}


def branch_refusal(os: str, name: str, allowed: list[str], branch: str) -> str:
    """Why source ``name`` on ``os``, which carries the driver branches ``allowed``, gives no
    lock of ``branch`` (one line)."""
    if not in_hash(os):
        return (f"package source '{name}' carries driver branch {', '.join(allowed)} only, "
                f"not {branch}; use --source nvidia or mirror")
    why = ((facts(os).get("sources") or {}).get(name) or {}).get("branches_why")
    if why:
        return (f"package source '{name}' on --os {os} gives driver branch {', '.join(allowed)} only, "
                f"not {branch}: {why}")
    return (f"package source '{name}' on --os {os} carries driver branch {', '.join(allowed)} only, "
            f"not {branch}; NVIDIA's own repository for {facts(os).get('title', os)} gives R580, "
            "whose package names gpuprov has not read yet")


def in_hash(os: str) -> bool:
    """Whether a lock's ``os`` is part of its hash (not for the default: old locks keep theirs)."""
    return os != DEFAULT_OS


def eol_warning(lock: LockData, on: date | None = None) -> str | None:
    """The end-of-life line for a distro lock of an OS other than the default (its own archive's
    support applies, and NVIDIA's repository for it is named), else None: the default's is
    gpuprov.lock.drivers.eol_warning."""
    os = lock.get("os") or DEFAULT_OS
    branch = str(lock.get("driver_branch") or "")
    if os == DEFAULT_OS or lock.get("source") != "distro" or not branch or not past_eol(branch, on):
        return None
    life = lifecycle(branch)
    own = (facts(os).get("sources") or {}).get("distro") or {}
    return (f"driver branch R{branch} ({life.get('kind', 'branch')}) reached its end of life in {life['eol']} "
            f"({LIFECYCLE_DOC}); this cluster's driver comes from the distribution: "
            f"{own.get('support', 'the distribution')} applies, not NVIDIA's; NVIDIA's own repository for "
            f"{facts(os).get('title', os)} gives R580 (gpuprov has not read its package names yet)")
