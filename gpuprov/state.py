"""SQLite state store.

One database file in the state directory. Safe for several gpuprov processes
at once: WAL journal, a generous busy timeout, and every write inside
``BEGIN IMMEDIATE`` so two writers serialise instead of failing half-way.
The schema is versioned with ``PRAGMA user_version`` and migrated forward
on open, under an exclusive lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov import paths, state_choice
from gpuprov.clock import utc_text
from gpuprov.errors import ClusterBusy, DamagedFile, GpuprovError
from gpuprov.lock.lock_data import LockData
from gpuprov.lock_holder import alive, holder_text

# Each entry moves the schema from version i to i+1. Never edit a released
# entry; append a new one.
MIGRATIONS: Sequence[str] = (
    # 1: clusters, nodes, runs
    """
    CREATE TABLE clusters (
        name      TEXT PRIMARY KEY,
        provider  TEXT NOT NULL,
        created   TEXT NOT NULL,
        state     TEXT NOT NULL,
        spec      TEXT NOT NULL DEFAULT '{}',
        lock      TEXT
    );
    CREATE TABLE nodes (
        cluster        TEXT NOT NULL REFERENCES clusters(name) ON DELETE CASCADE,
        name           TEXT NOT NULL,
        id             TEXT NOT NULL,
        address        TEXT NOT NULL,
        ssh_port       INTEGER NOT NULL,
        user           TEXT NOT NULL,
        state          TEXT NOT NULL,
        zone           TEXT NOT NULL DEFAULT '',
        instance_type  TEXT NOT NULL DEFAULT '',
        extra          TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (cluster, name)
    );
    CREATE TABLE runs (
        id            INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster       TEXT NOT NULL,
        kind          TEXT NOT NULL,
        started       TEXT NOT NULL,
        finished      TEXT,
        ok            INTEGER,
        artifact_dir  TEXT,
        summary       TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX runs_by_cluster ON runs(cluster, id);
    """,
    # 2: a cluster's state is the phase it reached (launching, launched, reachable,
    # bootstrapped, verified); the step that failed last is kept beside it.
    """
    ALTER TABLE clusters ADD COLUMN failed_step TEXT;
    UPDATE clusters SET failed_step = 'bootstrap', state = 'launched' WHERE state = 'failed';
    UPDATE clusters SET state = 'launched' WHERE state = 'running';
    UPDATE clusters SET state = 'bootstrapped' WHERE state = 'ready';
    """,
    # 3: the process that runs a run, so a run whose process died (kill -9, a lost controller)
    # is closed as interrupted instead of showing as running for good.
    """
    ALTER TABLE runs ADD COLUMN pid INTEGER;
    """,
    # 4: who last changed a cluster's record, and when (`status` and `list` show them).
    """
    ALTER TABLE clusters ADD COLUMN changed_by TEXT;
    ALTER TABLE clusters ADD COLUMN changed_at TEXT;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def now() -> str:
    return utc_text()


@dataclass(frozen=True)
class NodeRecord:
    name: str
    id: str
    address: str
    ssh_port: int
    user: str
    state: str
    zone: str = ""
    instance_type: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The node as docs/json-output.md's node shape has it."""
        return {
            "name": self.name,
            "id": self.id,
            "address": self.address,
            "ssh_port": self.ssh_port,
            "state": self.state,
            "zone": self.zone,
            "instance_type": self.instance_type,
        }


@dataclass(frozen=True)
class ClusterRecord:
    name: str
    provider: str
    created: str
    state: str
    spec: dict[str, Any]
    lock: LockData | None
    nodes: tuple[NodeRecord, ...] = ()
    failed_step: str | None = None
    changed_by: str | None = None  # who wrote the record last: "user@host" (None: before it was kept)
    changed_at: str | None = None  # when (UTC text)

    @property
    def state_text(self) -> str:
        """The phase reached, and the step that failed after it, for people."""
        return f"{self.state} ({self.failed_step} failed)" if self.failed_step else self.state


@dataclass(frozen=True)
class RunRecord:
    id: int
    cluster: str
    kind: str
    started: str
    finished: str | None
    ok: bool | None
    artifact_dir: str | None
    summary: dict[str, Any]


RESTORE = ("restore it from a backup, or move it aside (gpuprov starts a new one; clusters it knew can "
           "still be removed by tag with `gpuprov down NAME`)")


def operator() -> str:
    """Who this process acts for, as records and locks name them: ``user@host`` (the login name
    as getpass reads it: LOGNAME, USER, else the password database)."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


class Store:
    """The state store every command reads and writes. ``Store()`` opens the one the state
    setting chooses (gpuprov.state_choice: this machine's SQLite file by default, or a prefix of
    an S3 bucket a team shares: gpuprov.state_s3); ``Store(path)`` the SQLite file at ``path``.
    Both keep the same records, and say who changed a cluster last and when."""

    def __new__(cls, path: Path | None = None, **_: Any) -> Store:
        if cls is Store:
            cls = LocalStore if path is not None or state_choice.chosen() is None else _s3_store()
        return super().__new__(cls)

    # -- the interface (each backend implements every one) ---------------------------------
    def create_cluster(self, name: str, provider: str, spec: dict[str, Any],
                       lock: LockData | None = None) -> ClusterRecord:
        """Reserve a cluster name. Raises ``KeyError`` when it is taken."""
        raise NotImplementedError

    def get_cluster(self, name: str) -> ClusterRecord | None:
        raise NotImplementedError

    def list_clusters(self) -> list[ClusterRecord]:
        raise NotImplementedError

    def set_cluster_state(self, name: str, state: str) -> None:
        """The phase the cluster has reached now; clears the failed step."""
        raise NotImplementedError

    def set_failed_step(self, name: str, step: str | None) -> None:
        """Record that ``step`` failed; the phase reached stays as it is."""
        raise NotImplementedError

    def set_spec(self, name: str, spec: dict[str, Any]) -> None:
        raise NotImplementedError

    def set_lock(self, name: str, lock: LockData | None) -> None:
        raise NotImplementedError

    def replace_nodes(self, cluster: str, nodes: Sequence[NodeRecord]) -> None:
        raise NotImplementedError

    def delete_cluster(self, name: str) -> None:
        raise NotImplementedError

    def start_run(self, cluster: str, kind: str, artifact_dir: str | None) -> int:
        raise NotImplementedError

    def close_dead_runs(self, cluster: str) -> None:
        raise NotImplementedError

    def finish_run(self, run_id: int, ok: bool, summary: dict[str, Any]) -> None:
        raise NotImplementedError

    def runs(self, cluster: str, limit: int = 20) -> list[RunRecord]:
        raise NotImplementedError

    def hold(self, name: str, who: dict[str, Any]) -> AbstractContextManager[None]:
        """The cluster's lock for one mutating command, ``who`` (its pid, words, since) written in
        it; a second holder is refused at once (GpuprovError naming the first: ``holder_text``)."""
        raise NotImplementedError

    def where(self) -> str:
        """Where the records are, for people: a file's path, or ``s3://BUCKET/PREFIX``."""
        raise NotImplementedError


# The backends of a higher layer, by scheme: gpuprov.state_s3 adds "s3" when it is imported (the
# command line imports it where the state chosen is on S3: gpuprov.cli.app).
BACKENDS: dict[str, type[Store]] = {}


def _s3_store() -> type[Store]:
    if "s3" not in BACKENDS:
        raise GpuprovError("the state chosen is on S3 (GPUPROV_STATE, or the settings file's state), and this "
                           "process has not loaded gpuprov.state_s3; run gpuprov's command line")
    return BACKENDS["s3"]


class LocalStore(Store):
    """The SQLite file in the state directory (the default)."""

    def __init__(self, path: Path | None = None) -> None:
        """The store at ``path``. A file that does not exist yet is made by the first write, not
        here: a command that only reads (a dry run, a refused request) leaves no database."""
        self.path = path or (paths.home() / "state.db")
        self._ready = False
        if self.path.exists():
            self._open()

    def where(self) -> str:
        return str(self.path)

    def _open(self) -> None:
        self._migrate()
        if self.path.stat().st_mode & 0o077:  # the WAL and shared-memory files sqlite makes take its mode
            with suppress(OSError):
                os.chmod(self.path, 0o600)
        self._ready = True

    # -- plumbing ---------------------------------------------------------
    @contextmanager
    def _connect(self, file: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection, closed after use. The file's faults, at open or later (a page damaged
        since, a record of another shape), are one line naming it: damage is DamagedFile (exit
        2); what is not damage (permissions, a full disk, a lock held past the timeout) exit 1."""
        conn = None
        try:
            # No file yet and nothing to write: an empty database of the current schema, in memory.
            empty = not file and not self._ready and not self.path.exists()
            conn = sqlite3.connect(":memory:" if empty else self.path, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA foreign_keys = ON")
            if empty:
                conn.executescript(";".join(MIGRATIONS) + f";PRAGMA user_version = {SCHEMA_VERSION}")
            yield conn
        except sqlite3.OperationalError as exc:
            raise GpuprovError(f"state database {self.path} cannot be used ({exc}); fix its permissions or "
                               f"its disk, or if it is damaged, {RESTORE}") from None
        except (sqlite3.DatabaseError, ValueError) as exc:
            if isinstance(exc, sqlite3.IntegrityError):
                raise
            why = str(exc) if isinstance(exc, (sqlite3.DatabaseError, BadRecord)) else "a record is not JSON"
            raise DamagedFile("state database", self.path, why, RESTORE) from None
        finally:
            if conn is not None:
                conn.close()

    @contextmanager
    def _tx(self, mode: str = "IMMEDIATE", opening: bool = False) -> Iterator[sqlite3.Connection]:
        if not self._ready and not opening:
            self._open()  # the first write makes the file
        with self._connect(file=True) as conn:
            conn.execute(f"BEGIN {mode}")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _migrate(self) -> None:
        with self._connect(file=True) as conn:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
        with self._tx("EXCLUSIVE", opening=True) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise GpuprovError(
                    f"state database {self.path} has schema version {version}, newer than this "
                    f"gpuprov understands ({SCHEMA_VERSION}); upgrade gpuprov"
                )
            for target in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[target].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {target + 1}")

    def schema_version(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    # -- clusters ---------------------------------------------------------
    def create_cluster(
        self, name: str, provider: str, spec: dict[str, Any], lock: LockData | None = None
    ) -> ClusterRecord:
        """Reserve a cluster name. Raises ``KeyError`` when it is taken."""
        with self._tx() as conn:
            try:
                conn.execute(
                    "INSERT INTO clusters(name, provider, created, state, spec, lock, changed_by, changed_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        provider,
                        now(),
                        "launching",
                        json.dumps(spec),
                        json.dumps(lock) if lock is not None else None,
                        *_changed(),
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise KeyError(name) from exc
        cluster = self.get_cluster(name)
        assert cluster is not None
        return cluster

    def get_cluster(self, name: str) -> ClusterRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
            if row is None:
                return None
            nodes = conn.execute("SELECT * FROM nodes WHERE cluster = ? ORDER BY name", (name,)).fetchall()
            return _cluster(row, nodes)

    def list_clusters(self) -> list[ClusterRecord]:
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM clusters ORDER BY created, name").fetchall()
            return [_cluster(row, conn.execute("SELECT * FROM nodes WHERE cluster = ? ORDER BY name",
                                               (row["name"],)).fetchall()) for row in rows]

    def set_cluster_state(self, name: str, state: str) -> None:
        """The phase the cluster has reached now; clears the failed step."""
        with self._tx() as conn:
            conn.execute(f"UPDATE clusters SET state = ?, failed_step = NULL, {CHANGED} WHERE name = ?",
                         (state, *_changed(), name))

    def set_failed_step(self, name: str, step: str | None) -> None:
        """Record that ``step`` failed; the phase reached stays as it is."""
        with self._tx() as conn:
            conn.execute(f"UPDATE clusters SET failed_step = ?, {CHANGED} WHERE name = ?", (step, *_changed(), name))

    def set_spec(self, name: str, spec: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute(f"UPDATE clusters SET spec = ?, {CHANGED} WHERE name = ?",
                         (json.dumps(spec), *_changed(), name))

    def set_lock(self, name: str, lock: LockData | None) -> None:
        with self._tx() as conn:
            conn.execute(
                f"UPDATE clusters SET lock = ?, {CHANGED} WHERE name = ?",
                (json.dumps(lock) if lock is not None else None, *_changed(), name),
            )

    def replace_nodes(self, cluster: str, nodes: Sequence[NodeRecord]) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (cluster,))
            conn.execute(f"UPDATE clusters SET {CHANGED} WHERE name = ?", (*_changed(), cluster))
            conn.executemany(
                "INSERT INTO nodes(cluster, name, id, address, ssh_port, user, state, zone,"
                " instance_type, extra) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        cluster,
                        n.name,
                        n.id,
                        n.address,
                        n.ssh_port,
                        n.user,
                        n.state,
                        n.zone,
                        n.instance_type,
                        json.dumps(n.extra),
                    )
                    for n in nodes
                ],
            )

    def delete_cluster(self, name: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM clusters WHERE name = ?", (name,))

    # -- runs -------------------------------------------------------------
    def start_run(self, cluster: str, kind: str, artifact_dir: str | None) -> int:
        with self._tx() as conn:
            cur = conn.execute(
                "INSERT INTO runs(cluster, kind, started, artifact_dir, pid) VALUES (?, ?, ?, ?, ?)",
                (cluster, kind, now(), artifact_dir, os.getpid()),
            )
            assert cur.lastrowid is not None  # an INSERT's row
            return cur.lastrowid

    def close_dead_runs(self, cluster: str) -> None:
        """Close, as failed and interrupted, the unfinished runs of ``cluster`` whose process is
        gone (killed, or its machine restarted): nothing will finish them. A run recorded by an
        older gpuprov (no pid) is left as it is."""
        with self._tx() as conn:
            rows = conn.execute("SELECT id, pid FROM runs WHERE cluster = ? AND finished IS NULL "
                                "AND pid IS NOT NULL", (cluster,)).fetchall()
            for row in rows:
                if alive(int(row["pid"])):
                    continue
                summary = {"interrupted": f"its gpuprov process (pid {row['pid']}) ended before the run did"}
                conn.execute("UPDATE runs SET finished = ?, ok = 0, summary = ? WHERE id = ?",
                             (now(), json.dumps(summary), row["id"]))

    def finish_run(self, run_id: int, ok: bool, summary: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE runs SET finished = ?, ok = ?, summary = ? WHERE id = ?",
                (now(), int(ok), json.dumps(summary), run_id),
            )

    def runs(self, cluster: str, limit: int = 20) -> list[RunRecord]:
        self.close_dead_runs(cluster)
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM runs WHERE cluster = ? ORDER BY id DESC LIMIT ?", (cluster, limit)
            ).fetchall()
            return [
                RunRecord(id=r["id"], cluster=r["cluster"], kind=r["kind"], started=r["started"],
                          finished=r["finished"], ok=None if r["ok"] is None else bool(r["ok"]),
                          artifact_dir=r["artifact_dir"], summary=_object(r["summary"], "a run's summary"))
                for r in rows
            ]


    @contextmanager
    def hold(self, name: str, who: dict[str, Any]) -> Iterator[None]:
        """An flock on ``locks/NAME.lock`` in the state directory, ``who`` written into it (as
        JSON): the kernel ends it with its process, so a dead holder leaves no lock behind."""
        lock_dir = self.path.parent / "locks"
        lock_dir.mkdir(exist_ok=True, mode=0o700)
        fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ClusterBusy(f"cluster '{name}' is busy: {holder_text(os.pread(fd, 4096, 0))}") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(who).encode(), 0)
            yield
        finally:
            os.close(fd)


    def import_record(self, record: ClusterRecord) -> None:
        """`state pull`: the record as it is (its created, its last change and who made it), in
        place of the one of that name here."""
        with self._tx() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (record.name,))
            conn.execute("DELETE FROM clusters WHERE name = ?", (record.name,))
            conn.execute(
                "INSERT INTO clusters(name, provider, created, state, spec, lock, failed_step, changed_by, changed_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (record.name, record.provider, record.created, record.state, json.dumps(record.spec),
                 json.dumps(record.lock) if record.lock is not None else None, record.failed_step,
                 record.changed_by, record.changed_at))
        self.replace_nodes(record.name, record.nodes)
        with self._tx() as conn:  # replace_nodes stamped it: the record's own stamp again
            conn.execute(f"UPDATE clusters SET {CHANGED} WHERE name = ?",
                         (record.changed_by, record.changed_at, record.name))


# A cluster's record as one JSON document: the S3 state's object, and what `state push` and
# `state pull` carry (byte for byte the same from either store).
RECORD_FORMAT = 1


def record_dict(record: ClusterRecord) -> dict[str, Any]:
    out = dataclasses.asdict(record)
    out["nodes"] = [dataclasses.asdict(n) for n in record.nodes]
    return {"format": RECORD_FORMAT, **out}


def record_bytes(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True, indent=1) + "\n").encode()


def record_of(data: dict[str, Any]) -> ClusterRecord:
    """The record a document holds; TypeError, KeyError or ValueError where it is of another shape."""
    if data.get("format") != RECORD_FORMAT:
        raise ValueError(f"record format {data.get('format')!r}")
    fields = {k: v for k, v in data.items() if k not in ("format", "nodes")}
    for key in ("spec",):
        if not isinstance(fields.get(key), dict):
            raise TypeError(key)
    return ClusterRecord(**fields, nodes=tuple(NodeRecord(**n) for n in data.get("nodes") or ()))


# Who changed a cluster's record last, and when: set by every write of it.
CHANGED = "changed_by = ?, changed_at = ?"


def _changed() -> tuple[str, str]:
    return operator(), now()


class BadRecord(ValueError):
    """A record in the database of another shape than gpuprov writes."""


def _object(text: str | None, what: str, *, none_ok: bool = False) -> Any:
    value = json.loads(text or "") if text or not none_ok else None
    if not isinstance(value, dict) and not (none_ok and value is None):
        raise BadRecord(f"{what} is not a JSON object")
    return value


def _cluster(row: sqlite3.Row, nodes: Sequence[sqlite3.Row]) -> ClusterRecord:
    return ClusterRecord(
        name=row["name"],
        provider=row["provider"],
        created=row["created"],
        state=row["state"],
        spec=_object(row["spec"], "a cluster's spec"),
        lock=_object(row["lock"], "a cluster's lock", none_ok=True),
        failed_step=row["failed_step"],
        changed_by=row["changed_by"],
        changed_at=row["changed_at"],
        nodes=tuple(
            NodeRecord(
                name=n["name"],
                id=n["id"],
                address=n["address"],
                ssh_port=n["ssh_port"],
                user=n["user"],
                state=n["state"],
                zone=n["zone"],
                instance_type=n["instance_type"],
                extra=_object(n["extra"], "a node's extra"),
            )
            for n in nodes
        ),
    )
