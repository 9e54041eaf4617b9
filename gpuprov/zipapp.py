"""gpuprov's modules shipped to a node as one zipapp (the node's quick health, an elastic AWS
cluster's power service): the same bytes for the same source, so that a run that changes no
source copies nothing. Entries sorted, stored (no compressor's version in the bytes), every
time and mode fixed."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gpuprov

# The zip format's earliest time: the same for every entry of every build.
_EPOCH = (1980, 1, 1, 0, 0, 0)


def build(main: bytes, files: Iterable[str]) -> bytes:
    """A zipapp of ``files`` (paths relative to the gpuprov package, from the source of the
    gpuprov this is) under ``gpuprov/``, run by ``main`` (its ``__main__.py``)."""
    root = Path(gpuprov.__file__).resolve().parent
    entries = {"__main__.py": main, **{f"gpuprov/{rel}": (root / rel).read_bytes() for rel in files}}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = (0o100644 << 16)
            info.create_system = 3  # unix: the mode above is read as one
            zf.writestr(info, entries[name])
    return out.getvalue()


def write(path: Path, data: bytes) -> Path:
    """``data`` at ``path`` (0644), rewritten only when its bytes differ."""
    if not path.is_file() or path.read_bytes() != data:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)
    return path


@dataclass(frozen=True)
class Bundle:
    """One zipapp: its file name, its ``__main__.py`` and its files (``build``'s)."""

    name: str
    main: bytes
    files: tuple[str, ...]

    def build(self) -> bytes:
        """The zipapp's bytes, from the source of the gpuprov this is."""
        return build(self.main, self.files)

    def write(self, directory: Path) -> Path:
        """The zipapp in ``directory`` (rewritten only when its bytes differ), and its path."""
        return write(directory / self.name, self.build())
