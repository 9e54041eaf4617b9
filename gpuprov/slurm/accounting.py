"""A Slurm cluster's accounting (slurmdbd with MariaDB on the controller; `--no-accounting`:
none): its database password, made here by gpuprov like the munge key, and the rules of
slurmdbd.conf and the database's SQL, which are the slurm role's own (its filter plugin
roles/slurm/filter_plugins/gpuprov_slurmdbd.py, loaded here: one copy of them).

The password: 32 random bytes as 43 URL-safe characters, in the cluster's private directory
(0700, beside the munge key), mode 0600. The slurm play is given the file's path
(``slurm_accounting_password_src``) and reads it only inside no_log tasks, so its bytes are in
no extravars file, run artifact, log, state row or user-data; on the nodes it is only in
slurmdbd.conf (0600 slurm) on the dbd host, and in MariaDB's own user table as a hash.
"""

from __future__ import annotations

import secrets
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from gpuprov import paths
from gpuprov.errors import GpuprovError
from gpuprov.slurm.conf import call_rule
from gpuprov.slurm.munge import write_private

PASSWORD_FILE = "slurmdbd.pass"
PLUGIN = ("slurm", "filter_plugins", "gpuprov_slurmdbd.py")


@cache
def rules() -> ModuleType:
    """The role's slurmdbd filter plugin, loaded once from the roles directory gpuprov uses."""
    return paths.role_module("gpuprov_slurmdbd_rules", *PLUGIN)


def new_password() -> str:
    return secrets.token_urlsafe(32)


def ensure_password(path: Path) -> Path:
    """The cluster's database password at ``path``: made when missing, kept when there (slurmdbd
    and MariaDB hold it: a new one is set in both by the next run). A file there that others can
    read, or that holds no password the role takes, is an error naming neither its bytes, and
    is not replaced."""
    path = Path(path)
    if not path.exists():
        return write_private(path, new_password().encode())
    info = path.stat()
    if info.st_mode & 0o077:
        raise GpuprovError(f"{path}: mode {oct(info.st_mode & 0o777)} lets others read the accounting "
                           "database password; chmod 600 it")
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise GpuprovError(f"{path}: unreadable as the accounting database password ({type(exc).__name__})") from None
    if not rules().password_ok(text):
        raise GpuprovError(f"{path}: not an accounting database password ({rules().PASSWORD_RULE}; "
                           "remove it and gpuprov makes a new one at the next provision)")
    return path


def _call(name: str, *args: Any) -> Any:
    return call_rule(rules(), rules().SlurmdbdConfError, name, *args)


def slurmdbd_conf(dbd_host: str, password: str) -> str:
    """slurmdbd.conf as the role writes it on the dbd host."""
    return _call("slurmdbd_conf", {"dbd_host": dbd_host, "password": password})


def state_sql(password: str) -> str:
    """The SQL the role runs (as root over the socket) to read whether the database is ready."""
    return _call("state_sql", password)


def make_sql(password: str) -> str:
    """The SQL the role runs (as root over the socket) to make the database and its user."""
    return _call("make_sql", password)
