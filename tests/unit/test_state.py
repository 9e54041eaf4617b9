from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.state import MIGRATIONS, SCHEMA_VERSION, NodeRecord, Store


def _node(i: int) -> NodeRecord:
    return NodeRecord(name=f"n{i}", id=f"id{i}", address="127.0.0.1", ssh_port=2200 + i,
                      user="gpuprov", state="running", zone="local", instance_type="docker-node",
                      extra={"i": i})


def test_new_store_is_migrated_to_the_latest_schema(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    assert store.schema_version() == SCHEMA_VERSION
    # Re-opening does not re-run migrations (they would fail on existing tables).
    assert Store(tmp_path / "state.db").schema_version() == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db)
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(GpuprovError, match="newer than this gpuprov"):
        Store(db)


def test_cluster_nodes_and_runs_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    store.create_cluster("c1", "docker", {"count": 2})
    with pytest.raises(KeyError):
        store.create_cluster("c1", "static", {})
    store.replace_nodes("c1", [_node(1), _node(2)])
    store.set_cluster_state("c1", "ready")
    cluster = store.get_cluster("c1")
    assert cluster is not None
    assert cluster.state == "ready" and cluster.spec == {"count": 2}
    assert [n.name for n in cluster.nodes] == ["n1", "n2"]
    assert cluster.nodes[0].extra == {"i": 1}
    run = store.start_run("c1", "provision", "/tmp/x")
    store.finish_run(run, True, {"hosts": {"n1": {"changed": 0}}})
    (record,) = store.runs("c1")
    assert record.ok is True and record.summary["hosts"]["n1"]["changed"] == 0
    store.delete_cluster("c1")
    assert store.get_cluster("c1") is None
    assert store.list_clusters() == []


def _writer(db: str, worker: int, count: int) -> None:
    store = Store(Path(db))
    for i in range(count):
        run = store.start_run("shared", f"w{worker}", None)
        store.finish_run(run, True, {"i": i})
        store.replace_nodes("shared", [_node(worker * 1000 + i)])


def test_two_processes_do_not_corrupt_the_store(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    Store(db).create_cluster("shared", "docker", {})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(db), w, 60)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = Store(db)
    runs = store.runs("shared", limit=1000)
    assert len(runs) == 120
    assert all(r.ok for r in runs)
    cluster = store.get_cluster("shared")
    assert cluster is not None and len(cluster.nodes) == 1  # replace_nodes is atomic
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_old_states_migrate_to_phases(tmp_path: Path) -> None:
    """Schema 1 said running/ready/failed; schema 2 says the phase reached and the failed step."""
    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.executescript(MIGRATIONS[0])
    for name, state in (("a", "running"), ("b", "ready"), ("c", "failed")):
        conn.execute("INSERT INTO clusters(name, provider, created, state) VALUES (?, 'docker', 'x', ?)",
                     (name, state))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = Store(db)
    got = {c.name: (c.state, c.failed_step) for c in store.list_clusters()}
    assert got == {"a": ("launched", None), "b": ("bootstrapped", None), "c": ("launched", "bootstrap")}
    store.set_failed_step("b", "verify")
    assert store.get_cluster("b").state_text == "bootstrapped (verify failed)"
    store.set_cluster_state("b", "verified")
    assert store.get_cluster("b").failed_step is None


def test_a_run_whose_process_died_is_closed_as_interrupted(tmp_path: Path) -> None:
    """A run started by a process that died before finishing it (here: one that exits without
    finishing; `kill -9` alike) reads as finished, failed and interrupted; a run of a living
    process stays open, and a run recorded before pids were kept is left as it was."""
    import subprocess
    import sys

    path = tmp_path / "state.db"
    store = Store(path)
    store.create_cluster("c1", "docker", {})
    code = ("import sys; from pathlib import Path; from gpuprov.state import Store; "
            "print(Store(Path(sys.argv[1])).start_run('c1', 'provision', None))")
    dead = int(subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                              check=True).stdout)
    living = store.start_run("c1", "verify", None)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO runs(cluster, kind, started) VALUES ('c1', 'patch', 'then')")
    conn.close()
    runs = {r.kind: r for r in store.runs("c1")}
    assert runs["provision"].id == dead and runs["provision"].ok is False
    assert runs["provision"].finished is not None and "ended before the run did" in runs["provision"].summary["interrupted"]
    assert runs["verify"].id == living and (runs["verify"].finished, runs["verify"].ok) == (None, None)
    assert (runs["patch"].finished, runs["patch"].ok) == (None, None)
