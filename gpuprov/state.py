"""SQLite state store.

One database file in the state directory. Safe for several gpuprov processes
at once: WAL journal, a generous busy timeout, and every write inside
``BEGIN IMMEDIATE`` so two writers serialise instead of failing half-way.
The schema is versioned with ``PRAGMA user_version`` and migrated forward
on open, under an exclusive lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.clock import utc_text
from gpuprov.errors import DamagedFile, GpuprovError
from gpuprov.lock.lock_data import LockData

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


class Store:
    def __init__(self, path: Path | None = None) -> None:
        """The store at ``path``. A file that does not exist yet is made by the first write, not
        here: a command that only reads (a dry run, a refused request) leaves no database."""
        self.path = path or (paths.home() / "state.db")
        self._ready = False
        if self.path.exists():
            self._open()

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
                    "INSERT INTO clusters(name, provider, created, state, spec, lock)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        provider,
                        now(),
                        "launching",
                        json.dumps(spec),
                        json.dumps(lock) if lock is not None else None,
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
            conn.execute("UPDATE clusters SET state = ?, failed_step = NULL WHERE name = ?", (state, name))

    def set_failed_step(self, name: str, step: str | None) -> None:
        """Record that ``step`` failed; the phase reached stays as it is."""
        with self._tx() as conn:
            conn.execute("UPDATE clusters SET failed_step = ? WHERE name = ?", (step, name))

    def set_spec(self, name: str, spec: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE clusters SET spec = ? WHERE name = ?", (json.dumps(spec), name))

    def set_lock(self, name: str, lock: LockData | None) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE clusters SET lock = ? WHERE name = ?",
                (json.dumps(lock) if lock is not None else None, name),
            )

    def replace_nodes(self, cluster: str, nodes: Sequence[NodeRecord]) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM nodes WHERE cluster = ?", (cluster,))
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
                if _alive(int(row["pid"])):
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


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
