"""NVIDIA's redist archives of a CUDA line, rebuilt from NVIDIA's own wheels for the artifact mirror.

A CUDA line whose data lists ``archives`` ([[cuda."X.Y".archives]] in data/stack.toml) is
served by the artifact mirror the way NVIDIA's redist site serves it: one archive per
component (cuda_nvcc, cuda_cudart, cuda_cccl, nccl, cudnn), each with one top directory named
after the archive. Each archive is rebuilt from the wheels the data pins (pip
--require-hashes: the sha256 each wheel's index publishes), reproducibly (sorted entries, fixed
owner and time), so that its own sha256 can be pinned in the lock and checked by the node
before it unpacks anything. Plain tar, not NVIDIA's .tar.xz: the payload is mostly compressed
fatbinaries already (xz at preset 1 took cuDNN 9 from 479 to 332 MB and NCCL from 211 to 189
MB, at about three minutes of CPU per machine that builds the mirror; measured here), and a
plain tar's bytes depend on no compressor's version.

The layout is the toolkit's, not the wheel's: libraries go to ``lib64/`` (nvcc.profile links
from ``$(TOP)/lib64``; cuDNN keeps ``lib/``, as NVIDIA's cuDNN archive has it), each
``libX.so.N`` gets the ``libX.so`` link a linker needs, programs are executable, and the
wheel's own bookkeeping (``*.dist-info``, ``.metadata``, ``__init__.py``) is left out.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

MTIME = 1700000000  # fixed, for reproducible archives
SONAME = re.compile(r"^(lib[^/]+?\.so)\.(\d+)$")  # libcudart.so.13 -> (libcudart.so, 13)
EXECUTABLE_DIRS = ("bin/", "nvvm/bin/")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def line_archives(cuda: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The archives line ``cuda`` lists (none for a line its packages serve)."""
    return list((data.get("cuda", {}).get(cuda) or {}).get("archives") or [])


def all_archives(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for line in sorted(data.get("cuda", {})) for a in line_archives(line, data)]


def subdir(archive: dict[str, Any]) -> str:
    """The mirror directory of an archive: cudnn/ and nccl/ for those, cuda/ for the toolkit's."""
    return archive["component"] if archive["component"] in ("cudnn", "nccl") else "cuda"


def _pin(requirement: str) -> tuple[str, str, str]:
    """'NAME==VERSION --hash=sha256:HEX' -> (NAME, VERSION, HEX); anything else refused."""
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+) --hash=sha256:([0-9a-f]{64})", requirement)
    if match is None:
        raise ValueError(f"wheel pin {requirement!r}: expected 'NAME==VERSION --hash=sha256:HEX'")
    return match.group(1), match.group(2), match.group(3)


def _cached(archive: dict[str, Any], cache: Path) -> list[Path | None]:
    """Each pinned wheel found in ``cache`` with its pinned sha256 (None: not there); a cached
    file of the same name and other bytes is removed."""
    out: list[Path | None] = []
    for requirement in archive["wheels"]:
        name, version, digest = _pin(requirement)
        found = None
        for wheel in cache.glob(f"{name.replace('-', '_')}-{version}-*.whl"):
            if sha256(wheel) == digest:
                found = wheel
            else:
                wheel.unlink()
        out.append(found)
    return out


def fetch_wheels(archive: dict[str, Any], cache: Path) -> list[Path]:
    """The archive's wheels, downloaded once (pip checks each pinned sha256; a cached wheel is
    checked again here, and dropped when it differs)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached(archive, cache)
    missing = [r for r, w in zip(archive["wheels"], found, strict=True) if w is None]
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
            req.write("".join(f"{r}\n" for r in missing))
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--require-hashes", "-r", req.name, "-d", str(cache)], check=True)
        finally:
            os.unlink(req.name)
        found = _cached(archive, cache)
    lacking = [r.split(" ")[0] for r, w in zip(archive["wheels"], found, strict=True) if w is None]
    if lacking:
        raise RuntimeError(f"no wheel with the pinned sha256 for {', '.join(lacking)} in {cache}")
    return [w for w in found if w is not None]


def _members(wheels: list[Path], strip: str, keep_lib: bool) -> dict[str, tuple[Path, str]]:
    """Archive path (below the top directory) -> (wheel, member), every wheel's files under
    ``strip``; a path two wheels both carry is refused (the archive would depend on order)."""
    members: dict[str, tuple[Path, str]] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as whl:
            for info in whl.infolist():
                name = info.filename
                if info.is_dir() or not name.startswith(strip):
                    continue
                rel = name[len(strip):]
                if rel.startswith(".metadata/") or rel.endswith("__init__.py") or "__pycache__" in rel:
                    continue
                if not keep_lib and rel.startswith("lib/"):
                    rel = "lib64/" + rel[len("lib/"):]
                if rel in members:
                    raise ValueError(f"{rel} is in both {members[rel][0].name} and {wheel.name}")
                members[rel] = (wheel, name)
    return members


def _licence(wheels: list[Path]) -> bytes:
    with zipfile.ZipFile(wheels[0]) as whl:
        name = next((n for n in whl.namelist() if n.endswith(("License.txt", "LICENSE.txt", "LICENSE"))), None)
        return whl.read(name) if name else b""


def build_archive(archive: dict[str, Any], wheels: list[Path], out: Path) -> Path:
    """Repack ``wheels`` into ``out/<archive>`` (NVIDIA's redist layout, reproducibly)."""
    path = out / archive["archive"]
    if not archive["archive"].endswith(".tar"):
        raise ValueError(f"{archive['archive']}: the mirror's line archives are plain .tar files")
    top = archive["archive"].removesuffix(".tar")
    keep_lib = archive["component"] == "cudnn"
    members = _members(wheels, archive["strip"], keep_lib)
    if not members:
        raise ValueError(f"{archive['archive']}: no file of its wheels is under {archive['strip']}")
    links = {}
    for rel in members:
        folder, _, base = rel.rpartition("/")
        match = SONAME.match(base)
        if match and f"{folder}/{match.group(1)}" not in members:
            links[f"{folder}/{match.group(1)}"] = base
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")

    def info(name: str) -> tarfile.TarInfo:
        entry = tarfile.TarInfo(f"{top}/{name}")
        entry.mtime, entry.uid, entry.gid, entry.uname, entry.gname = MTIME, 0, 0, "root", "root"
        return entry

    opened: dict[Path, zipfile.ZipFile] = {}
    try:
        with tarfile.open(tmp, mode="w", format=tarfile.GNU_FORMAT) as tar:
            licence = _licence(wheels)
            entry = info("LICENSE")
            entry.size, entry.mode = len(licence), 0o644
            tar.addfile(entry, io.BytesIO(licence))
            for rel in sorted({*members, *links}):
                entry = info(rel)
                if rel in links:
                    entry.type, entry.linkname, entry.mode = tarfile.SYMTYPE, links[rel], 0o777
                    tar.addfile(entry)
                    continue
                wheel, member = members[rel]
                whl = opened.setdefault(wheel, zipfile.ZipFile(wheel))
                executable = rel.startswith(EXECUTABLE_DIRS) and not rel.endswith((".profile", ".stub"))
                entry.size = whl.getinfo(member).file_size
                entry.mode = 0o755 if executable or ".so" in rel else 0o644
                with whl.open(member) as fh:
                    tar.addfile(entry, fh)
    finally:
        for whl in opened.values():
            whl.close()
    tmp.replace(path)
    return path


def build(directory: Path, data: dict[str, Any], wheel_cache: Path,
          lines: frozenset[str] | None = None) -> dict[str, str]:
    """Every line's archives under ``directory`` (cuda/, cudnn/, nccl/), or those of ``lines``
    alone, built only when missing or not the pinned bytes: {relative path: sha256}."""
    sums = {}
    chosen = sorted(data.get("cuda", {})) if lines is None else sorted(lines)
    for archive in (a for line in chosen for a in line_archives(line, data)):
        path = directory / subdir(archive) / archive["archive"]
        if not path.exists() or sha256(path) != archive.get("archive_sha256"):
            build_archive(archive, fetch_wheels(archive, wheel_cache), path.parent)
        sums[f"{subdir(archive)}/{archive['archive']}"] = sha256(path)
    return sums


def mismatches(sums: dict[str, str], data: dict[str, Any]) -> list[str]:
    """Archives whose rebuilt sha256 is not the one the data pins, in words."""
    pinned = {f"{subdir(a)}/{a['archive']}": a.get("archive_sha256", "") for a in all_archives(data)}
    return [f"{path}: built {sums.get(path)}, pinned {want or '(none)'}" for path, want in pinned.items()
            if path in sums and sums[path] != want]
