"""Slurm's accounting database: slurmdbd.conf and the SQL that makes slurmdbd's database and user
(MariaDB from the distribution, on the host slurmdbd runs on). The one copy of these rules: the
slurm role's templates and tasks call them as filters, and gpuprov's ``gpuprov.slurm.accounting``
loads this very file. Standard library only.

The database password is the one value here that is a secret. It is checked (letters, digits,
``-`` and ``_``, 16 to 128 of them: nothing that could end a line of slurmdbd.conf, start a
comment or leave an SQL string) and never put in an error message; the tasks that carry it are
``no_log``, and the SQL reaches ``mysql`` on its standard input, never its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# The database and its user, on the dbd host's MariaDB (reached over its unix socket: localhost).
DATABASE = "slurm_acct_db"
DB_USER = "slurm"
# DbdHost: the dbd host's `hostname -s` (slurmdbd refuses to start on any other host).
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
PASSWORD = re.compile(r"[A-Za-z0-9_-]{16,128}")
PASSWORD_RULE = "16 to 128 letters, digits, '-' or '_'"
# What `state_sql` prints when the database, the user with this password and its grants are
# all there (anything else: something to make).
READY = "ready"
# The privileges GRANT ALL gives on a database, as mysql.db keeps them: all of them 'Y' means
# the grant is there.
_PRIVILEGES = ("Select", "Insert", "Update", "Delete", "Create", "Drop", "Index", "Alter", "Create_tmp_table",
               "Lock_tables", "Create_view", "Show_view", "Create_routine", "Alter_routine", "Execute", "Event",
               "Trigger")


class SlurmdbdConfError(ValueError):
    """A setting slurmdbd.conf or the database cannot take safely (never quoting the password)."""


def _password(value: Any) -> str:
    if not isinstance(value, str) or not PASSWORD.fullmatch(value):
        kind = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
        raise SlurmdbdConfError(f"the accounting database password ({kind}, not shown) must be {PASSWORD_RULE}")
    return value


def password_ok(value: Any) -> bool:
    """Whether ``value`` is a password the rules take (for an assert that names no value)."""
    return isinstance(value, str) and PASSWORD.fullmatch(value) is not None


def slurmdbd_conf(settings: Mapping[str, Any]) -> str:
    """slurmdbd.conf (mode 0600, owned by SlurmUser: it holds the password): munge
    authentication, the daemon on ``dbd_host``, its records in MariaDB on the same host."""
    if not isinstance(settings, Mapping):
        raise SlurmdbdConfError("slurmdbd settings: expected a mapping")
    host = settings.get("dbd_host")
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        raise SlurmdbdConfError(f"dbd_host {host!r}: expected a host name (letters, digits, '-', '_')")
    password = _password(settings.get("password"))
    return "\n".join([
        "# slurmdbd.conf written by the slurm role (gpuprov); 0600, SlurmUser's: it holds the database password.",
        "AuthType=auth/munge",
        f"DbdHost={host}",
        "SlurmUser=slurm",
        "PidFile=/run/slurmdbd.pid",
        "LogFile=/var/log/slurm/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        f"StorageLoc={DATABASE}",
        f"StorageUser={DB_USER}",
        f"StoragePass={password}",
    ]) + "\n"


def state_sql(password: Any) -> str:
    """SQL (for root, over the socket) printing READY when the database exists and its user logs
    in with ``password`` and holds every privilege on it; else what is missing."""
    password = _password(password)
    user = f"User = '{DB_USER}' AND Host = 'localhost'"
    granted = " AND ".join(f"{p}_priv = 'Y'" for p in _PRIVILEGES)
    return (
        "SELECT IF(CONCAT_WS(',', "
        f"(SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{DATABASE}'), "
        f"(SELECT COUNT(*) FROM mysql.user WHERE {user} AND authentication_string = PASSWORD('{password}')), "
        f"(SELECT COUNT(*) FROM mysql.db WHERE Db = '{DATABASE}' AND {user} AND {granted})"
        f") = '1,1,1', '{READY}', 'missing');\n"
    )


def make_sql(password: Any) -> str:
    """SQL (for root, over the socket) making the database and its user, setting the password
    and granting the user the database: each statement a no-op where it holds already."""
    password = _password(password)
    return "\n".join([
        f"CREATE DATABASE IF NOT EXISTS {DATABASE};",
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost';",
        f"ALTER USER '{DB_USER}'@'localhost' IDENTIFIED BY '{password}';",
        f"GRANT ALL ON {DATABASE}.* TO '{DB_USER}'@'localhost';",
        "",
    ])


class FilterModule:
    def filters(self):
        return {
            "slurm_slurmdbd_conf": slurmdbd_conf,
            "slurm_dbd_password_ok": password_ok,
            "slurm_dbd_state_sql": state_sql,
            "slurm_dbd_make_sql": make_sql,
        }
