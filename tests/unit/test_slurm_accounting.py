"""Slurm's accounting (issue 59): slurm.conf's accounting lines and slurmdbd.conf (the slurm role's
filter plugins, through gpuprov.slurm.conf and gpuprov.slurm.accounting), the SQL that makes the
database, the database password gpuprov makes (0600, never in the play's variables or any file
but its own), and what `--no-accounting` / `--accounting` make of a cluster's recorded choice."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpuprov.ansible.runner import write_extravars
from gpuprov.core import elastic
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles
from gpuprov.slurm import accounting, conf, scheduler
from gpuprov.slurm.conf import SlurmCluster, SlurmNode
from gpuprov.slurm.scheduler_choice import Scheduler
from gpuprov.state import ClusterRecord, NodeRecord

LOCAL = SlurmNode(name="demo-1", addr="172.17.0.3", cpus=2, sockets=1, cores_per_socket=2, threads_per_core=1,
                  memtotal_mb=24 * 1024)
H100 = SlurmNode(name="h100-1", addr="10.0.0.11", cpus=16, sockets=1, cores_per_socket=16, threads_per_core=1,
                 memtotal_mb=128 * 1024, gpus=2, gpu_model="H100")
PASSWORD = "Zq3_kV-8mN2pL7xR4tY9wB1cD6fG0hJ5sA"


def _cluster(*nodes: SlurmNode, **kw) -> SlurmCluster:
    return SlurmCluster(cluster_name="train", controller=nodes[0].name, nodes=tuple(nodes), **kw)


def _lines(text: str, *prefixes: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefixes)]


ACCOUNTING_KEYS = ("Accounting", "JobAcctGather", "Priority")


# -- slurm.conf ---------------------------------------------------------------------------------

def test_without_accounting_slurm_conf_says_none_and_nothing_more() -> None:
    text = conf.slurm_conf(_cluster(LOCAL))
    assert _lines(text, *ACCOUNTING_KEYS) == ["AccountingStorageType=accounting_storage/none",
                                              "JobAcctGatherType=jobacct_gather/none"]
    # An empty accounting is none, the same file byte for byte.
    assert conf.slurm_conf({**_cluster(LOCAL).description(), "accounting": {}}) == text


def test_with_accounting_slurm_conf_names_slurmdbd_the_gpu_tres_and_fairshare() -> None:
    text = conf.slurm_conf(_cluster(H100, LOCAL, accounting_host="10.0.0.11", fairshare_weight=5000))
    assert _lines(text, *ACCOUNTING_KEYS) == [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=10.0.0.11",
        "AccountingStorageTRES=gres/gpu,gres/gpu:h100",
        "JobAcctGatherType=jobacct_gather/cgroup",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=5000",
        "PriorityWeightAge=1000",
    ]
    # The rest of the file is the one without accounting.
    without = conf.slurm_conf(_cluster(H100, LOCAL))
    rest = [line for line in text.splitlines() if not line.startswith((*ACCOUNTING_KEYS, "# Accounting"))]
    assert rest == [line for line in without.splitlines() if not line.startswith(ACCOUNTING_KEYS)]


@pytest.mark.parametrize(("sharing", "instances", "tres"), [
    ("none", None, "gres/gpu"),  # a cluster without GPUs keeps gres/gpu: a node with GPUs may join
    ("mig:all-balanced", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
     "gres/gpu,gres/gpu:1g.10gb,gres/gpu:2g.20gb,gres/gpu:3g.40gb"),
    ("shard:4", None, "gres/gpu,gres/gpu:h100,gres/shard"),
    ("mps", None, "gres/gpu,gres/gpu:h100,gres/mps"),
])
def test_the_gpu_tres_follow_the_gpus_and_their_sharing(sharing, instances, tres) -> None:
    nodes = (LOCAL,) if sharing == "none" else (H100,)
    text = conf.slurm_conf(_cluster(*nodes, accounting_host="demo-1", gpu_sharing=sharing,
                                    gpu_sharing_instances=instances))
    assert _lines(text, "AccountingStorageTRES=") == [f"AccountingStorageTRES={tres}"]


@pytest.mark.parametrize(("accounting", "words"), [
    ({"host": "10.0.0.5\nAccountingStorageType=accounting_storage/none"}, "accounting host"),
    ({"host": "db#1"}, "accounting host"),
    ({"host": "db=1"}, "accounting host"),
    ({"host": ""}, "no host"),
    ({"fairshare_weight": 10}, "no host"),
    ({"host": "db", "fairshare_weight": -1}, "fairshare_weight"),
    ({"host": "db", "fairshare_weight": 10 ** 7}, "fairshare_weight"),
    ({"host": "db", "fairshare_weight": True}, "fairshare_weight"),
    ("db", "accounting: expected a mapping"),
])
def test_an_accounting_that_could_add_a_line_is_refused(accounting, words) -> None:
    with pytest.raises(BadInput, match=words) as info:
        conf.slurm_conf({**_cluster(LOCAL).description(), "accounting": accounting})
    assert "\n" not in str(info.value)


# -- slurmdbd.conf and the SQL -------------------------------------------------------------------

def test_slurmdbd_conf_keeps_the_records_in_mariadb_on_its_own_host() -> None:
    assert accounting.slurmdbd_conf("train-node-1", PASSWORD).splitlines()[1:] == [
        "AuthType=auth/munge",
        "DbdHost=train-node-1",
        "SlurmUser=slurm",
        "PidFile=/run/slurmdbd.pid",
        "LogFile=/var/log/slurm/slurmdbd.log",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageLoc=slurm_acct_db",
        "StorageUser=slurm",
        f"StoragePass={PASSWORD}",
    ]


@pytest.mark.parametrize("bad", [
    "short", "x" * 129, "pass word-long-enough", "a#comment-long-enough", "quote'd-long-enough",
    "new\nline-long-enough", "back\\slash-long-enough", "semi;colon-long-enough", "dollar$-long-enough",
])
def test_a_password_that_could_leave_its_line_or_its_string_is_refused_and_never_shown(bad: str) -> None:
    for call in (lambda: accounting.slurmdbd_conf("db", bad), lambda: accounting.state_sql(bad),
                 lambda: accounting.make_sql(bad)):
        with pytest.raises(BadInput, match="password") as info:
            call()
        message = str(info.value)
        assert "\n" not in message and bad not in message, message
    assert accounting.rules().password_ok(bad) is False


@pytest.mark.parametrize("host", ["", "db\nStoragePass=x", "db host", "db=1", "-db", None])
def test_slurmdbd_conf_refuses_a_host_that_is_no_host_name(host) -> None:
    with pytest.raises(BadInput, match="dbd_host"):
        accounting.slurmdbd_conf(host, PASSWORD)


def test_the_sql_holds_the_password_only_inside_its_string_literals() -> None:
    make = accounting.make_sql(PASSWORD)
    assert make.splitlines() == [
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db;",
        "CREATE USER IF NOT EXISTS 'slurm'@'localhost';",
        f"ALTER USER 'slurm'@'localhost' IDENTIFIED BY '{PASSWORD}';",
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';",
    ]
    state = accounting.state_sql(PASSWORD)
    assert state.count(PASSWORD) == 1 and f"PASSWORD('{PASSWORD}')" in state
    assert state.strip().endswith("'ready', 'missing');") and state.count("\n") == 1


# -- the password file ---------------------------------------------------------------------------

def test_the_password_is_made_once_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "private" / accounting.PASSWORD_FILE
    assert accounting.ensure_password(path) == path
    first = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert accounting.rules().password_ok(first) and len(first) == 43 and not first.endswith("\n")
    accounting.ensure_password(path)
    assert path.read_text() == first
    other = tmp_path / "other" / accounting.PASSWORD_FILE
    assert accounting.ensure_password(other).read_text() != first


def test_a_password_file_others_read_or_holding_no_password_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / accounting.PASSWORD_FILE
    path.write_text(PASSWORD)
    path.chmod(0o644)
    with pytest.raises(GpuprovError, match="lets others read"):
        accounting.ensure_password(path)
    path.write_text("not a password; at all")
    path.chmod(0o600)
    with pytest.raises(GpuprovError, match="not an accounting database password") as info:
        accounting.ensure_password(path)
    assert "at all" not in str(info.value) and path.read_text() == "not a password; at all"


# -- the choice, as recorded, and the play's variables ----------------------------------------------

def _record(options: dict, home: Path) -> tuple[ClusterRecord, ClusterFiles]:
    nodes = tuple(NodeRecord(name=n, id=n, address="127.0.0.1", ssh_port=2200 + i, user="gpuprov", state="running",
                             instance_type="docker-node") for i, n in enumerate(("c-node-1", "c-node-2")))
    record = ClusterRecord(name="c", provider="docker", spec={"options": options}, nodes=nodes, lock={"hash": "a"},
                           state="verified", created="2026", failed_step=None)
    return record, ClusterFiles(home)


def test_accounting_is_on_by_default_and_off_is_what_the_record_keeps() -> None:
    assert Scheduler(kind="slurm").accounting is True
    assert Scheduler(kind="slurm").as_options() == {"scheduler": "slurm"}
    off = Scheduler(kind="slurm", accounting=False)
    assert off.as_options() == {"scheduler": "slurm", "slurm_accounting": False}
    assert Scheduler.from_options(off.as_options()) == off
    assert Scheduler.from_options({"scheduler": "slurm"}).accounting is True  # a record from before


def test_no_accounting_without_slurm_is_one_line() -> None:
    with pytest.raises(BadInput, match="--no-accounting goes with --scheduler slurm") as info:
        Scheduler(kind="none", accounting=False).checked()
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("recorded", "given", "flag", "want"), [
    (Scheduler(kind="slurm", accounting=False), None, None, None),  # nothing asked: nothing changes
    (Scheduler(kind="slurm"), None, False, Scheduler(kind="slurm", accounting=False)),
    (Scheduler(kind="slurm", accounting=False), None, True, Scheduler(kind="slurm")),
    # --scheduler slurm again keeps the recorded accounting, as it keeps the dynamic nodes
    (Scheduler(kind="slurm", accounting=False, max_count=3), Scheduler(kind="slurm"), None,
     Scheduler(kind="slurm", accounting=False, max_count=3)),
    (Scheduler(kind="none"), Scheduler(kind="slurm"), None, Scheduler(kind="slurm")),
    (Scheduler(kind="none"), Scheduler(kind="slurm"), False, Scheduler(kind="slurm", accounting=False)),
    (Scheduler(kind="none"), None, False, Scheduler(kind="none", accounting=False)),  # refused by checked()
])
def test_provision_keeps_the_recorded_accounting_unless_told(recorded, given, flag, want) -> None:
    assert elastic.merged(recorded, given, None, None, flag) == want


def test_the_play_gets_the_password_files_path_never_its_bytes(tmp_path: Path) -> None:
    cluster, files = _record({"scheduler": "slurm"}, tmp_path / "clusters" / "c")
    found = scheduler.play_vars(cluster, files, list(cluster.nodes))
    path = Path(found["gpuprov_slurm_accounting_password"])
    assert found["gpuprov_slurm_accounting"] is True and path == files.dir / accounting.PASSWORD_FILE
    password = path.read_text()
    assert password not in json.dumps(found)
    write_extravars(files.dir / "vars.yml", found)
    leaks = [p.name for p in tmp_path.rglob("*") if p.is_file() and p != path and password.encode() in p.read_bytes()]
    assert leaks == []
    # Off: no password file is made, and the play is told so.
    cluster, files = _record({"scheduler": "slurm", "slurm_accounting": False}, tmp_path / "clusters" / "d")
    found = scheduler.play_vars(cluster, files, list(cluster.nodes))
    assert found["gpuprov_slurm_accounting"] is False and "gpuprov_slurm_accounting_password" not in found
    assert not (files.dir / accounting.PASSWORD_FILE).exists()
