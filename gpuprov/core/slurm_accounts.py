"""`gpuprov slurm account add|list`: a Slurm cluster's accounts and users, made and read with
`sacctmgr` on the controller over its pinned SSH connection; and the export of its accounting
(every job's `sacct` line and a `mysqldump` of the database) that `down --keep-accounting` makes
before the controller goes (docs/slurm.md, "Accounting")."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuprov import ssh
from gpuprov.cluster import load, refresh
from gpuprov.console import Console
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import SlurmAccount, SlurmAccounts
from gpuprov.slurm import accounts as rules
from gpuprov.slurm import scheduler
from gpuprov.state import ClusterRecord, NodeRecord, Store

EXPORT_PREFIX = "accounting-"
SACCT_FILE = "sacct.txt"
DUMP_FILE = f"{rules.DATABASE}.sql"
EXPORT_TIMEOUT_S = 600


def refuse_without_accounting(cluster: ClusterRecord, what: str) -> None:
    """BadInput (one line, exit 2) for a cluster without Slurm, or recorded with --no-accounting."""
    chosen = scheduler.of(cluster)
    if chosen.kind != "slurm":
        raise BadInput(f"{cluster.name}: runs no Slurm, so it has no Slurm accounting for {what} "
                       f"(`gpuprov provision {cluster.name} --scheduler slurm`)")
    if not chosen.accounting:
        raise BadInput(f"{cluster.name}: recorded with --no-accounting, so it has no accounting database for "
                       f"{what} (`gpuprov provision {cluster.name} --accounting` turns it on)")


def _open(name: str, what: str, store: Store | None) -> tuple[ClusterRecord, ClusterFiles, list[NodeRecord]]:
    store = store or Store()
    cluster = load(store, name)
    refuse_without_accounting(cluster, what)
    _, files, nodes = refresh(store, cluster)
    return cluster, files, nodes


def _run(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord], argv: tuple[str, ...]) -> str:
    _, out, why = scheduler.on_controller(cluster, files, nodes, argv)
    if out is None:
        raise GpuprovError(f"{cluster.name}: {why}")
    return out


def listed(name: str, store: Store | None = None) -> SlurmAccounts:
    cluster, files, nodes = _open(name, "`slurm account list`", store)
    found = rules.parse_associations(_run(cluster, files, nodes, rules.LIST_ASSOCIATIONS))
    return SlurmAccounts(cluster=name, controller=scheduler.controller_of(cluster),
                         accounts=[SlurmAccount(account=a, users=u) for a, u in found.items()])


def add(name: str, account: str, users: list[str], console: Console, store: Store | None = None) -> dict[str, Any]:
    """Account ``account`` with ``users`` in it: each made only where Slurm lacks it, and said
    so either way. Every name is checked before anything is asked of the controller."""
    rules.check_name(account, "account")
    if not users:
        raise BadInput("gpuprov slurm account add NAME ACCOUNT: at least one --user USER")
    for user in users:
        rules.check_name(user, "--user")
    cluster, files, nodes = _open(name, "`slurm account add`", store)
    controller = scheduler.controller_of(cluster)
    found = rules.parse_associations(_run(cluster, files, nodes, rules.LIST_ASSOCIATIONS))
    added = []
    if account in found:
        console.say(f"{name}: account {account} is there already")
    else:
        _run(cluster, files, nodes, rules.add_account(account))
        console.say(f"{name}: account {account} added (sacctmgr on {controller})")
        added.append(account)
    for user in dict.fromkeys(users):
        if user in found.get(account, []):
            console.say(f"{name}: user {user} is in account {account} already")
            continue
        _run(cluster, files, nodes, rules.add_user(user, account))
        console.say(f"{name}: user {user} added to account {account}")
        added.append(f"{user}@{account}")
    if not added:
        console.say(f"{name}: nothing changed")
    return {"cluster": name, "account": account, "added": added}


def export(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord], console: Console,
           now: datetime | None = None) -> Path:
    """Every job's `sacct` line and a `mysqldump` of the accounting database, streamed over the
    controller's pinned SSH connection into ``clusters/NAME/accounting-STAMP/`` (0700, its files
    0600), kept after `down`. A failure is GpuprovError naming why: the caller deletes nothing."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    target = files.dir / f"{EXPORT_PREFIX}{stamp}"
    target.mkdir(mode=0o700)
    os.chmod(target, 0o700)
    controller, dbd = scheduler.controller_of(cluster), scheduler.dbd_of(cluster)
    try:
        for argv, file_name, what, on in (
                (rules.SACCT_ALL, SACCT_FILE, "every job's sacct line", controller),
                (rules.MYSQLDUMP, DUMP_FILE, f"a mysqldump of {rules.DATABASE}", dbd)):
            console.say(f"{cluster.name}: exporting {what} from {on} into {target / file_name}")
            _stream(cluster, files, nodes, argv, target / file_name, on_dbd=on != controller)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # half an export is none
        raise
    return target


def _stream(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord], argv: tuple[str, ...],
            path: Path, on_dbd: bool = False) -> None:
    command = scheduler.dbd_command if on_dbd else scheduler.controller_command
    controller, cmd = command(cluster, files, nodes, argv)
    program = argv[2] if argv[0] == "sudo" else argv[0]
    if isinstance(cmd, str):
        raise GpuprovError(f"{program}: {cmd}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        try:
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=False, check=False,
                                  stdin=subprocess.DEVNULL, timeout=EXPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise GpuprovError(f"{program} on {controller}: no end within {EXPORT_TIMEOUT_S}s") from None
    if proc.returncode != 0:
        raise GpuprovError(f"{program} on {controller}: "
                           + ssh.ssh_error_line(proc.stderr.decode(errors="replace"), proc.returncode))
    if path.stat().st_size == 0:
        raise GpuprovError(f"{program} on {controller}: wrote nothing")
