"""A cluster's munge key: made here, once, by gpuprov (never by a node), kept in the cluster's
private files beside its SSH key, and copied to every node by the slurm role
(``slurm_munge_key_src``). Its bytes are never logged, printed or put in a variable."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpuprov.errors import GpuprovError

# munge's own `mungekey` writes 1024 bytes by default; munged refuses keys under 32.
KEY_BYTES = 1024
MIN_KEY_BYTES = 32


def new_key() -> bytes:
    return os.urandom(KEY_BYTES)


def write_key(path: Path, key: bytes) -> Path:
    """Write ``key`` to ``path``, mode 0600, atomically (write_private)."""
    if len(key) < MIN_KEY_BYTES:
        raise GpuprovError(f"a munge key of {len(key)} bytes: munged needs at least {MIN_KEY_BYTES}")
    return write_private(path, key)


def write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path``, mode 0600, atomically: a new temporary file in the same
    directory (created 0600, never wider, named afresh), synced, then renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # A name of its own (mkstemp: O_EXCL, mode 0600): a stale temporary file left by a process
    # killed mid-write, under any name, never stops this one.
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def ensure_key(path: Path) -> Path:
    """The cluster's key at ``path``: made when missing, kept when there (one key per cluster:
    a new one would lock every node out of the others until all had it). A file there that is
    no key, or that others can read, is an error, not replaced."""
    path = Path(path)
    if not path.exists():
        return write_key(path, new_key())
    info = path.stat()
    if info.st_size < MIN_KEY_BYTES:
        raise GpuprovError(f"{path}: {info.st_size} bytes is no munge key (at least {MIN_KEY_BYTES})")
    if info.st_mode & 0o077:
        raise GpuprovError(f"{path}: mode {oct(info.st_mode & 0o777)} lets others read the munge key; "
                           "chmod 600 it")
    return path
