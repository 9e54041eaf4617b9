"""A node whose slurm.conf serves another cluster is never clobbered (gpuprov.slurm.scheduler):
the ClusterName parse, the name the slurm play would write, which runs check, and the refusal
built from each node's answer (ssh replaced by a recorder of what would run; the real SSH path
is tests/e2e/test_slurm_e2e.py)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from gpuprov import paths
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles
from gpuprov.slurm import scheduler
from gpuprov.slurm.scheduler_choice import Scheduler
from gpuprov.state import ClusterRecord, NodeRecord

# What Debian's slurm.conf of another site looks like (spaces, case and comments as Slurm's
# parser takes them).
OTHER_SITE = """\
# slurm.conf of the lab's cluster
#ClusterName=commented-out
SlurmctldHost=head01
clustername = "Lab-West"   # quoted, spaced, any case
NodeName=gpu[01-04] CPUs=64 Gres=gpu:a100:8
"""


@pytest.mark.parametrize("text, want", [
    ("ClusterName=train\n", "train"),
    (OTHER_SITE, "lab-west"),
    ("ClusterName=Alpha\nClusterName=beta\n", "beta"),  # given twice: Slurm keeps the last
    ("SlurmctldHost=x ClusterName=inline\n", "inline"),
    ("ClusterName=a\\#b\n", "a\\#b"),  # an escaped '#' is no comment
    ("ClusterName=ab#c\n", "ab"),
    ("# ClusterName=off\nSlurmctldHost=x\n", None),
    ("", None),
    ("MyClusterName=nope\n", None),  # another key ending in the word
    ("ClusterName=\x1b[31mred\n", "?[31mred"),  # nothing of the file moves the terminal
])
def test_conf_cluster_name(text: str, want: str | None) -> None:
    assert scheduler.conf_cluster_name(text) == want


def test_the_name_is_the_one_the_slurm_play_writes() -> None:
    play = (paths.playbooks_dir() / "slurm.yml").read_text()
    # The rule mirrored here; a change to the play must change slurm_cluster_name too.
    assert "gpuprov_cluster | lower | regex_replace('[^a-z0-9_-]', '-')" in play
    assert scheduler.slurm_cluster_name("Train.West 2") == "train-west-2"
    assert scheduler.slurm_cluster_name("slurm-ab12_c") == "slurm-ab12_c"


def _node(name: str, port: int) -> NodeRecord:
    return NodeRecord(name=name, id=name, address="127.0.0.1", ssh_port=port, user="gpuprov", state="running")


def _cluster(name: str = "Train", scheduler_kind: str | None = None, count: int = 2) -> ClusterRecord:
    options = {"scheduler": scheduler_kind} if scheduler_kind else {}
    return ClusterRecord(name=name, provider="docker", created="", state="bootstrapped",
                         spec={"options": options}, lock=None,
                         nodes=tuple(_node(f"n{i}", 2200 + i) for i in range(1, count + 1)))


def test_which_runs_configure_slurm() -> None:
    plain, slurm = _cluster(), _cluster(scheduler_kind="slurm")
    assert not scheduler.would_configure(plain, list(plain.nodes))
    assert scheduler.would_configure(plain, list(plain.nodes), Scheduler(kind="slurm"))
    assert scheduler.would_configure(slurm, list(slurm.nodes))
    assert scheduler.would_configure(slurm, list(slurm.nodes), tags=["rdma", "slurm"])
    assert not scheduler.would_configure(slurm, list(slurm.nodes), tags=["rdma"])
    assert not scheduler.would_configure(slurm, list(slurm.nodes), Scheduler(kind="none"))
    # A run on some of the nodes leaves Slurm as it is (play_vars): nothing to check.
    assert not scheduler.would_configure(slurm, list(slurm.nodes)[:1])


class FakeSsh:
    """subprocess.run for the nodes: each node (by its port) answers (exit status, stdout,
    stderr), or one after another from a list; every command line is kept."""

    def __init__(self, answers: dict[int, tuple[int, str, str] | list[tuple[int, str, str]]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs):
        self.calls.append(cmd)
        answer = self.answers[int(cmd[cmd.index("-p") + 1])]
        rc, out, err = answer.pop(0) if isinstance(answer, list) else answer
        return subprocess.CompletedProcess(cmd, rc, out, err)


def _refuse(monkeypatch, tmp_path: Path, answers, cluster: ClusterRecord | None = None,
            wait: float = 0.0) -> FakeSsh:
    fake = FakeSsh(answers)
    monkeypatch.setattr(scheduler.subprocess, "run", fake)
    monkeypatch.setattr(scheduler, "READ_WAIT_S", wait)
    monkeypatch.setattr(scheduler.time, "sleep", lambda _s: None)
    cluster = cluster or _cluster()
    scheduler.refuse_foreign(cluster, ClusterFiles(tmp_path), list(cluster.nodes))
    return fake


def test_a_node_serving_another_cluster_is_refused_in_one_line(monkeypatch, tmp_path) -> None:
    with pytest.raises(BadInput) as exc:
        _refuse(monkeypatch, tmp_path, {2201: (3, "", ""), 2202: (0, OTHER_SITE, "")})
    text = str(exc.value)
    assert len(text.splitlines()) == 1
    assert text.startswith("n2: its /etc/slurm/slurm.conf serves Slurm cluster 'lab-west'"), text
    assert "'train'" in text and "n1" not in text
    assert exc.value.exit_code == 2


def test_a_file_naming_no_cluster_is_refused_too(monkeypatch, tmp_path) -> None:
    with pytest.raises(BadInput) as exc:
        _refuse(monkeypatch, tmp_path, {2201: (0, "SlurmctldHost=x\n", ""), 2202: (3, "", "")})
    assert str(exc.value).startswith("n1: its /etc/slurm/slurm.conf names no ClusterName"), exc.value


def test_no_file_or_this_clusters_own_passes_over_the_pinned_connection(monkeypatch, tmp_path) -> None:
    fake = _refuse(monkeypatch, tmp_path, {2201: (3, "", ""), 2202: (0, "ClusterName=train\n", "")})
    assert len(fake.calls) == 2
    for cmd in fake.calls:
        # The pinned host keys, options ended before the destination, and a fixed command.
        assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in cmd
        assert "StrictHostKeyChecking=yes" in cmd and "BatchMode=yes" in cmd
        assert cmd[-3:-1] == ["--", "gpuprov@127.0.0.1"]
        assert shlex.split(cmd[-1]) == list(scheduler.READ_CONF)


REFUSED = (255, "", "ssh: connect to host 127.0.0.1 port 2201: Connection refused")


def test_a_node_just_started_is_asked_again_until_it_answers(monkeypatch, tmp_path) -> None:
    # Its sshd not up yet, then its file: skipped at the first refusal, it would be clobbered by
    # the run a moment later.
    with pytest.raises(BadInput, match="lab-west"):
        _refuse(monkeypatch, tmp_path, {2201: [REFUSED, REFUSED, (0, OTHER_SITE, "")], 2202: (3, "", "")},
                wait=60.0)


def test_an_unreachable_node_is_left_to_the_run_and_an_unreadable_file_refused(monkeypatch, tmp_path) -> None:
    # ssh's own failure (255) past the wait: the run reports the node and leaves it out.
    _refuse(monkeypatch, tmp_path, {2201: REFUSED, 2202: (3, "", "")})
    with pytest.raises(GpuprovError) as exc:
        _refuse(monkeypatch, tmp_path, {2201: (1, "", "cat: /etc/slurm/slurm.conf: Permission denied"),
                                        2202: (3, "", "")})
    assert not isinstance(exc.value, BadInput)
    assert "n1: /etc/slurm/slurm.conf could not be read (cat: /etc/slurm/slurm.conf: Permission denied)" \
        in str(exc.value)
