"""`--slurm-dbd NODE` (issue 59): slurmdbd and MariaDB on a node of the cluster's choosing
instead of the controller. The choice is checked (a node name, Slurm's, with accounting on),
recorded with the cluster and kept by a later `provision` unless given again; a database
already on a node is never moved by a choice that names another; the slurm play is told the
node (slurm_dbd_host); `down --keep-accounting` dumps the database there. The real placement is
tests/e2e/test_patch_e2e.py's (its fleet keeps its database on its third node through the
rolls)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuprov.core import elastic
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.slurm import scheduler
from gpuprov.slurm.scheduler_choice import Scheduler
from gpuprov.state import ClusterRecord, NodeRecord
from tests.conftest import invoke


def _node(i: int) -> NodeRecord:
    return NodeRecord(name=f"demo-node-{i}", id=f"c{i}", address="127.0.0.1", ssh_port=2200 + i, user="gpuprov",
                      state="running", zone="local", instance_type="docker-node")


def _cluster(**options) -> ClusterRecord:
    return ClusterRecord(name="demo", provider="docker", created="2026-12-01T00:00:00+00:00", state="verified",
                         spec={"options": options}, lock=None, nodes=tuple(_node(i) for i in (1, 2, 3)))


@pytest.mark.parametrize(("choice", "words"), [
    (Scheduler(kind="none", dbd="demo-node-2"), "--slurm-dbd goes with --scheduler slurm"),
    (Scheduler(kind="slurm", accounting=False, dbd="demo-node-2"),
     "--slurm-dbd names where Slurm's accounting runs: it cannot go with --no-accounting"),
    (Scheduler(kind="slurm", dbd="node 2"), "--slurm-dbd 'node 2': not a node name"),
    (Scheduler(kind="slurm", dbd="n\n2"), "--slurm-dbd 'n\\n2': not a node name"),
])
def test_a_choice_that_cannot_be_is_one_line(choice: Scheduler, words: str) -> None:
    with pytest.raises(BadInput) as raised:
        choice.checked()
    assert str(raised.value) == words


def test_the_choice_is_recorded_and_read_back() -> None:
    choice = Scheduler(kind="slurm", dbd="demo-node-3")
    assert choice.as_options() == {"scheduler": "slurm", "slurm_dbd": "demo-node-3"}
    assert Scheduler.from_options(choice.as_options()) == choice
    assert "slurm_dbd" not in Scheduler(kind="slurm").as_options()


def test_the_node_is_the_controller_unless_one_is_named() -> None:
    assert scheduler.dbd_of(_cluster(scheduler="slurm")) == "demo-node-1"
    assert scheduler.dbd_of(_cluster(scheduler="slurm", slurm_controller="demo-node-2")) == "demo-node-2"
    assert scheduler.dbd_of(_cluster(scheduler="slurm", slurm_dbd="demo-node-3")) == "demo-node-3"
    with pytest.raises(BadInput, match=r"--slurm-dbd demo-node-9: no node of cluster 'demo' has that name "
                                       r"\(demo-node-1, demo-node-2, demo-node-3\)"):
        scheduler.dbd_of(_cluster(scheduler="slurm"), Scheduler(kind="slurm", dbd="demo-node-9"))


@pytest.mark.parametrize(("given", "accounting", "want"), [
    (None, None, None),  # nothing asked: nothing changes
    (Scheduler(kind="slurm"), None, "demo-node-3"),  # --scheduler slurm again: kept as recorded
    (Scheduler(kind="slurm", dbd="demo-node-2"), None, "demo-node-2"),  # given: taken (record() refuses the move)
    (None, False, None),  # accounting off: no node for it
])
def test_a_provision_keeps_the_recorded_node_unless_given(given, accounting, want) -> None:
    recorded = Scheduler(kind="slurm", dbd="demo-node-3")
    made = elastic.merged(recorded, given, None, None, accounting)
    assert (made.dbd if made is not None else None) == want


def test_a_database_already_on_a_node_is_not_moved_by_a_choice(tmp_path: Path, monkeypatch) -> None:
    recorded = _cluster(scheduler="slurm", slurm_dbd="demo-node-3")
    written = []

    class Store:
        def set_spec(self, name, spec):
            written.append(spec)

        def get_cluster(self, name):
            return dataclasses.replace(recorded, spec=written[-1])

    with pytest.raises(BadInput, match=r"keeps its accounting database on demo-node-3; moving it to another node "
                                       r"is not built"):
        scheduler.record(Store(), recorded, Scheduler(kind="slurm", dbd="demo-node-2"))
    with pytest.raises(BadInput, match="keeps its accounting database on demo-node-3"):
        scheduler.record(Store(), recorded, Scheduler(kind="slurm"))  # the controller is another node
    assert written == []
    # The same node again, or accounting turned off: recorded.
    scheduler.record(Store(), recorded, Scheduler(kind="slurm", dbd="demo-node-3"))
    scheduler.record(Store(), recorded, Scheduler(kind="slurm", accounting=False))
    assert [w["options"].get("slurm_dbd") for w in written] == ["demo-node-3", None]
    # A cluster without accounting yet takes any of its nodes.
    plain = _cluster(scheduler="slurm", slurm_accounting=False)
    scheduler.record(Store(), plain, Scheduler(kind="slurm", dbd="demo-node-2"))
    assert written[-1]["options"]["slurm_dbd"] == "demo-node-2"


def test_the_slurm_play_is_told_the_node(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path)
    made = scheduler.accounting_vars(_cluster(scheduler="slurm", slurm_dbd="demo-node-2"), files,
                                     Scheduler(kind="slurm", dbd="demo-node-2"))
    assert made["gpuprov_slurm_accounting"] is True and made["gpuprov_slurm_dbd_host"] == "demo-node-2"
    assert scheduler.accounting_vars(_cluster(scheduler="slurm"), files,
                                     Scheduler(kind="slurm"))["gpuprov_slurm_dbd_host"] == "demo-node-1"
    assert scheduler.accounting_vars(_cluster(scheduler="slurm"), files,
                                     Scheduler(kind="slurm", accounting=False)) == {"gpuprov_slurm_accounting": False}


def test_the_dump_runs_on_the_dbd_node_and_sacct_on_the_controller(tmp_path: Path) -> None:
    cluster = _cluster(scheduler="slurm", slurm_dbd="demo-node-3")
    files = ClusterFiles(tmp_path)
    (tmp_path / "known_hosts").write_text("")
    nodes = list(cluster.nodes)
    on_ctl, ctl_cmd = scheduler.controller_command(cluster, files, nodes, ("sacct",))
    on_dbd, dbd_cmd = scheduler.dbd_command(cluster, files, nodes, ("mysqldump",))
    assert (on_ctl, on_dbd) == ("demo-node-1", "demo-node-3")
    assert ctl_cmd[:3] == ["ssh", "-p", "2201"] and dbd_cmd[:3] == ["ssh", "-p", "2203"]


@pytest.mark.parametrize(("args", "words"), [
    (["provision", "nosuch", "--slurm-dbd", "demo-node-2"], "gpuprov: --slurm-dbd goes with --scheduler slurm"),
    (["up", "--provider", "docker", "--count", "2", "--scheduler", "slurm", "--no-accounting", "--slurm-dbd",
      "x-node-2", "--dry-run"],
     "gpuprov: --slurm-dbd names where Slurm's accounting runs: it cannot go with --no-accounting"),
    (["up", "--provider", "docker", "--count", "2", "--slurm-dbd", "x-node-2", "--dry-run"],
     "gpuprov: --slurm-dbd goes with --scheduler slurm"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_made(capsys, gpuprov_home: Path, args, words) -> None:
    code, out, err = invoke(capsys, *args)
    assert (code, out, err.strip()) == (2, "", words)
    assert not (gpuprov_home / "clusters").exists()
