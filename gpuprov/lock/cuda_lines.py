"""CUDA lines: the CUDA releases a lock can carry (11.8, the default; 12.9; 13.0; and 12.4, Debian
13's own toolkit, with --os debian13 --source distro only: gpuprov.lock.os_lines), each with the
facts of ``data/stack.toml`` ([cuda."X.Y"]): its minimum driver, the GPU architectures it
drives, cuDNN and NCCL built for it, and whether gpuprov installs it yet. ``gpuprov.lock.stack``
resolves a lock of any line with these rules; `up`, `provision` and `patch` install only the
lines marked installable.

What `--cuda` accepts: a line as the lock records it (``12.9``), or a major release alone
(``13``, ``13.x``) for the one line of that major. Any other ``X.Y`` passes through, so that
the architecture rule can say which CUDA a GPU needs before the data says it lacks the line.
"""

from __future__ import annotations

import re
from typing import Any

from gpuprov.artifact_archives import line_archives, subdir
from gpuprov.errors import BadInput
from gpuprov.lock.drivers import _v, data

SPELLING = re.compile(r"([0-9]{1,2})(?:\.([0-9]{1,2}|x|X))?")
# Where the line facts come from (the comments of data/stack.toml name each document).
ARCH_DOC = "CUDA Toolkit release notes"


def lines() -> dict[str, dict[str, Any]]:
    """Every line of the data, {"X.Y": facts}."""
    return dict(data()["cuda"])


def names() -> list[str]:
    """The lines, oldest first."""
    return sorted(lines(), key=_v)


def installable() -> list[str]:
    """The lines `up`, `provision` and `patch` install."""
    return [n for n in names() if is_installable(n)]


def listing() -> str:
    return ", ".join(names())


def os_only(cuda: str) -> list[str]:
    """The operating systems line ``cuda`` is packaged for alone ([] for a line of every OS:
    NVIDIA's repository and the mirror); Debian 13's own CUDA 12.4 is one (gpuprov.lock.os_lines)."""
    return list(lines().get(cuda, {}).get("os", ()))


def spelled(value: str, os: str | None = None) -> str:
    """The line a `--cuda` value names: ``X.Y`` as given, ``X`` or ``X.x`` the one line of
    major X (where a major has a line of every OS and one of ``os`` alone, the latter on that
    OS, else the former). Anything else is refused (one line)."""
    match = SPELLING.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise BadInput(f"--cuda {value!r}: expected a CUDA line like 11.8, 12.9 or 13 (lines: {listing()})")
    major, minor = match.groups()
    if minor is not None and minor not in ("x", "X"):
        return value
    of_major = [n for n in names() if n.split(".")[0] == str(int(major))]
    if len(of_major) > 1:
        own = [n for n in of_major if os in os_only(n)]
        of_major = own or [n for n in of_major if not os_only(n)]
    if len(of_major) != 1:
        raise BadInput(f"gpuprov's stack data has no CUDA {int(major)}.x line (available: {listing()})")
    return of_major[0]


def line(cuda: str) -> dict[str, Any]:
    """The facts of line ``cuda`` (refused when the data lacks it)."""
    facts = lines().get(cuda)
    if facts is None:
        raise BadInput(f"gpuprov's stack data has no CUDA {cuda} (available: {listing()})")
    return facts


def min_driver(cuda: str) -> str:
    return str(line(cuda)["min_driver"])


# Architecture families by compute capability (the CUDA GPUs table), for messages.
FAMILIES = ((50, "Maxwell"), (60, "Pascal"), (70, "Volta"), (75, "Turing"), (80, "Ampere"), (89, "Ada"),
            (90, "Hopper"), (100, "Blackwell"))


def family(arch: str) -> str:
    number = arch_number(arch)
    return next((name for low, name in reversed(FAMILIES) if number >= low), "pre-Maxwell")


def arch_number(arch: str) -> int:
    """sm_75 -> 75, sm_100 -> 100: compute capabilities compare as numbers."""
    return int(arch.split("_", 1)[1])


def arch_reason(cuda: str, arch: str) -> str | None:
    """Why line ``cuda`` cannot drive ``arch``, or None."""
    facts = line(cuda)
    low, high = facts["arch_min"], facts["arch_max"]
    if arch_number(arch) < arch_number(low):
        return (f"CUDA {cuda} supports {low} and newer ({ARCH_DOC}: CUDA {cuda.split('.')[0]} dropped "
                f"offline compilation and library support for older architectures)")
    if arch_number(arch) > arch_number(high):
        return f"CUDA {cuda} supports up to {high} ({ARCH_DOC})"
    return None


def lines_for_arch(arch: str | None) -> list[str]:
    """The lines of every OS whose architecture range holds ``arch`` (every such line for no
    GPU); a line one OS packages alone (Debian 13's 12.4) is that OS's, not a type's."""
    return [n for n in names() if not os_only(n) and (arch is None or arch_reason(n, arch) is None)]


def way_forward(arch: str, cuda: str) -> str:
    """'; use --cuda A or --cuda B' naming the lines that drive ``arch`` ('' when none)."""
    others = [n for n in lines_for_arch(arch) if n != cuda]
    return f"; use {' or '.join(f'--cuda {n}' for n in reversed(others))}" if others else ""


def source_refusal(cuda: str, source: str) -> str | None:
    """Why package source ``source`` gives no lock of line ``cuda``, or None."""
    facts = line(cuda)
    why = facts.get("refused", {}).get(source)
    if why:
        return f"CUDA {cuda} with package source '{source}': {why}"
    if facts.get("sources") is not None and source not in facts["sources"]:
        return f"CUDA {cuda}: gpuprov has no package names of package source '{source}' for it"
    return None


def own_archives(cuda: str) -> list[dict[str, str]]:
    """The redist archives the artifact mirror serves for line ``cuda``, as the lock pins them:
    {"component", "archive", "sha256", "dir"} ("dir": the mirror's directory of it)."""
    return [{"component": a["component"], "archive": a["archive"], "sha256": a["archive_sha256"],
             "dir": subdir(a)} for a in line_archives(cuda, data())]


def is_installable(cuda: str, source: str | None = None) -> bool:
    """Whether `up` installs line ``cuda`` (from package source ``source``; None: from every
    source). False for a line the data lacks."""
    facts = lines().get(cuda, {})
    return bool(facts.get("installable")) or (source is not None and source in facts.get("installable_sources", ()))


def installable_on(os: str) -> list[str]:
    """``LINE (--source S)`` for each line `up` installs on ``os`` (an OS of its own in the data,
    not Debian 12): the lines its sources carry that gpuprov installs from that source."""
    found: dict[str, list[str]] = {}
    for name, src in ((data().get("os", {}).get(os) or {}).get("sources") or {}).items():
        for cuda in src.get("cuda_lines") or ():
            if is_installable(cuda, name):
                found.setdefault(cuda, []).append(f"--source {name}")
    return [f"{cuda} ({' or '.join(how)})" for cuda, how in sorted(found.items(), key=lambda kv: _v(kv[0]))]


def not_installed_yet(cuda: str, instance_type: str = "TYPE", source: str | None = None,
                      os: str | None = None) -> str | None:
    """One line when gpuprov resolves line ``cuda`` but does not install it (from ``source``, on
    ``os``: None or Debian 12, the lines of every OS), else None."""
    if is_installable(cuda, source):
        return None
    if os is not None and os in data().get("os", {}):
        there = installable_on(os)
        title = data()["os"][os].get("title", os)
        flags = f" --os {os}" + (f" --source {source}" if source else "")
        return (f"CUDA {cuda} resolves (`gpuprov stack --type {instance_type} --cuda {cuda}{flags}` shows its "
                f"lock) but gpuprov does not install it yet: on {title}, up, provision and patch install "
                + (f"CUDA {', '.join(there)}" if there else "no CUDA line yet"))
    only = list(lines().get(cuda, {}).get("installable_sources", ()))
    where = (f"; it installs CUDA {cuda} with {' or '.join(f'--source {s}' for s in only)}" if only
             else "")
    own = os_only(cuda)
    flags = f" --os {own[0]} --source {next(iter(lines()[cuda].get('sources') or {'distro': 0}))}" if own else ""
    return (f"CUDA {cuda} resolves (`gpuprov stack --type {instance_type} --cuda {cuda}{flags}` shows its lock) but "
            f"gpuprov does not install it yet: up, provision and patch install CUDA "
            f"{', '.join(installable())}{where}")


def pieces(cuda: str, source: str, instance_type: str = "TYPE", os: str | None = None) -> dict[str, Any]:
    """What line ``cuda`` puts in a lock besides the driver: cuDNN (version, archive), NCCL and
    nccl-tests, the CUDA and cuDNN package names of ``source`` and the notes. CUDA 11.8 keeps
    its pieces in the data's [cudnn], [nccl] and [sources.*] (where they were before lines);
    every other line carries its own."""
    facts = data()
    own = line(cuda)
    named = (own.get("sources") or {}).get(source)
    if named is None:
        src = facts["sources"][source]
        named = {k: src[k] for k in ("cuda_package", "cuda_version", "cudnn_packages", "cudnn_version",
                                     "cudnn_method")}
    cudnn, nccl = facts["cudnn"], facts["nccl"]
    mine = "cudnn" in own
    archives = own_archives(cuda) if named.get("cuda_method") == "archives" else []
    # cuDNN's archive: the line's own, also for a line whose CUDA comes from packages (Debian 13's
    # 12.4: its toolkit from trixie's archive, cuDNN 9 from the artifact mirror).
    cudnn_own = next((a for a in own_archives(cuda) if a["component"] == "cudnn"), None) if (
        named.get("cudnn_method") == "tarball") else None
    out: dict[str, Any] = {
        "cudnn": own["cudnn"] if mine else cudnn["version"],
        "cudnn_archive": cudnn_own["archive"] if cudnn_own else "" if mine else cudnn["archive"],
        "cudnn_archive_sha256": cudnn_own["sha256"] if cudnn_own else "" if mine else cudnn["archive_sha256"],
        "cuda_archives": [a for a in archives if a["component"] != "cudnn"],
        "nccl": own.get("nccl") or nccl["version"],
        "nccl_tests": own.get("nccl_tests", nccl["tests"]) or None,
        "nccl_tests_sha256": nccl["tests_sha256"] if own.get("nccl_tests", nccl["tests"]) else "",
        "packages": {"cuda": named["cuda_package"], "cuda_version": named["cuda_version"],
                     "cudnn": list(named["cudnn_packages"]), "cudnn_version": named["cudnn_version"],
                     "cudnn_method": named["cudnn_method"]},
        "notes": [],
    }
    if named.get("cuda_method", "packages") != "packages":
        # Only where it is not the packages (so that every lock stored before keeps its hash).
        out["packages"]["cuda_method"] = named["cuda_method"]
    if archives:
        out["notes"].append(f"CUDA {own['version']} from the artifact mirror as NVIDIA's redist archives "
                            f"({', '.join(a['component'] for a in archives)}), each checked against its sha256")
    later = not_installed_yet(cuda, instance_type, source, os)
    if later:
        out["notes"].append(later)
    if own.get("base_image_tags") and not own.get("base_images"):
        out["notes"].append(f"base images not pinned by digest yet: {', '.join(own['base_image_tags'])}")
    if not out["nccl_tests"]:
        out["notes"].append(f"nccl-tests: no release pinned for CUDA {cuda} yet")
    return out
