"""Review 4, item 4 and its small findings: while a `patch` roll holds a node, nothing else
resumes it. A node its own health drained before the roll gets the roll's Reason (the health's
kept in it), so the slurm role's health program, which resumes only its own Reason, leaves it
drained however well its checks pass; the roll's end decides. Then: Slurm node names are
checked whole (a trailing newline is no name), the munge key is written whatever stale
temporary file lies beside it, and the health program that finds its configuration file
malformed drains the node saying so instead of stopping with a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuprov.providers import ClusterFiles
from gpuprov.slurm import drain, munge
from gpuprov.slurm.drain import HEALTH, NAME
from gpuprov.state import NodeRecord
from tests.unit.node_programs import load_health_program as _program
from tests.unit.slurm_standin import NODE, Slurm, _health_program_runs, _roll


def test_the_health_programs_reason_is_the_one_the_roll_knows() -> None:
    assert _program().PREFIX == HEALTH


def test_a_node_its_health_drained_is_held_by_the_roll_and_its_health_cannot_resume_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", "gpuprov health: gpu_count: 7 of 8 GPUs answer nvidia-smi")
    roll = _roll(slurm, tmp_path)
    assert roll.drain(NODE) == (True, "")
    state, reason = slurm.get()
    assert "DRAIN" in state and reason.startswith("gpuprov patch: run 7 (was gpuprov health: gpu_count")
    assert "the roll holds it" in roll.notes[NODE] and NODE not in roll.kept
    # Mid-patch: the node's own checks pass (no service, no GPU asked): it is not resumed.
    _health_program_runs(slurm, tmp_path, monkeypatch, json.dumps({"services": [], "gpus": 0}))
    assert slurm.get() == (state, reason)
    assert not [ln for ln in slurm.log.read_text().splitlines() if ln.startswith("update")]
    # The roll's end decides: healthy, resumed.
    roll.resume(NODE)
    assert slurm.get() == ("IDLE", "") and roll.notes[NODE].endswith("resumed")


def test_a_node_its_health_drained_that_fails_the_roll_stays_drained_with_why(tmp_path: Path) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", "gpuprov health: nvidia_persistenced_active: inactive")
    roll = _roll(slurm, tmp_path)
    roll.drain(NODE)
    roll.failed(NODE, "probes failed after the patch: gpu_answers")
    state, reason = slurm.get()
    assert "DRAIN" in state and reason == "gpuprov patch failed: probes failed after the patch: gpu_answers"


def test_a_node_someone_else_drained_is_still_left_so(tmp_path: Path) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", "bad DIMM, ticket 42")
    roll = _roll(slurm, tmp_path)
    roll.drain(NODE)
    roll.resume(NODE)
    assert slurm.get() == ("IDLE+DRAIN", "bad DIMM, ticket 42") and roll.kept == {NODE: "bad DIMM, ticket 42"}


@pytest.mark.parametrize(("config", "says"), [
    ("[1, 2]", "is not a JSON object"),
    ('{"services": [], "gpus": "many"}', "gpus: not a count"),
    ('{"services": [], "gpus": true}', "gpus: not a count"),
    ('{"services": 5, "gpus": 0}', "services: not a list of unit names"),
    ('{"services": [["docker"]], "gpus": 0}', "services: not a list of unit names"),
    ('{"services": [], "gpus": 0', "is not JSON"),
    (b"\xff\xfe{}".decode("latin-1"), "is not JSON"),
])
def test_a_malformed_health_config_drains_the_node_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             config: str, says: str) -> None:
    slurm = Slurm(tmp_path, "IDLE", "")
    _health_program_runs(slurm, tmp_path, monkeypatch, config)
    state, reason = slurm.get()
    assert "DRAIN" in state and reason.startswith("gpuprov health: config: ") and says in reason, reason
    assert reason.isprintable() and len(reason) <= 200


def test_checks_that_break_drain_the_node_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = Slurm(tmp_path, "IDLE", "")
    monkeypatch.setenv("PATH", f"{slurm.bin}:{os.environ['PATH']}")
    program = _program()

    def broken(config: dict, started: float) -> list:
        raise KeyError("checks")

    monkeypatch.setattr(program, "failures", broken)
    path = tmp_path / "gpuprov-health.json"
    path.write_text('{"services": [], "gpus": 0}')
    monkeypatch.setattr(program, "CONFIG", str(path))
    monkeypatch.setattr(program.socket, "gethostname", lambda: NODE)
    assert program.main() == 0
    assert slurm.get()[1].startswith("gpuprov health: health_program: the checks stopped (KeyError")


def test_no_health_config_is_nothing_to_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = Slurm(tmp_path, "IDLE", "")
    monkeypatch.setenv("PATH", f"{slurm.bin}:{os.environ['PATH']}")
    program = _program()
    monkeypatch.setattr(program, "CONFIG", str(tmp_path / "missing.json"))
    assert program.main() == 0 and not slurm.log.exists()


@pytest.mark.parametrize("name", ["n1\n", "n1\nx", "n1 ", ""])
def test_a_slurm_name_is_checked_whole(name: str) -> None:
    assert NAME.fullmatch(name) is None
    assert NAME.fullmatch("ip-10-0-1-5")


def test_slurm_names_refuses_a_hostname_with_a_trailing_newline(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    from gpuprov.errors import GpuprovError

    node = NodeRecord(name="a", id="1", address="10.0.0.1", ssh_port=22, user="u", state="running", zone="static")
    monkeypatch.setattr(drain, "run_on", lambda n, f, argv: "n1.\n")  # 'n1.' -> 'n1' ... then:
    assert drain.slurm_names([node], ClusterFiles(tmp_path)) == {"a": "n1"}
    monkeypatch.setattr(drain, "run_on", lambda n, f, argv: " n1;reboot\n")
    with pytest.raises(GpuprovError, match="not a Slurm node name"):
        drain.slurm_names([node], ClusterFiles(tmp_path))


def test_the_munge_key_is_written_over_a_stale_temporary_file_of_the_same_pid(tmp_path: Path) -> None:
    path = tmp_path / "private" / "munge.key"
    path.parent.mkdir(mode=0o700)
    stale = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    stale.write_bytes(b"left by a process killed mid-write")
    munge.write_key(path, b"k" * munge.MIN_KEY_BYTES)
    assert path.read_bytes() == b"k" * munge.MIN_KEY_BYTES and (path.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, stale.name])


@pytest.mark.parametrize("name", ["n1\n", "n1;reboot", "n1 n2"])
def test_the_full_levels_srun_refuses_a_slurm_name_that_is_not_whole(name: str) -> None:
    from gpuprov.health.cluster_nccl import Peer, srun_command

    node = NodeRecord(name="a", id="1", address="10.0.0.1", ssh_port=22, user="u", state="running", zone="static")
    with pytest.raises(ValueError, match="no Slurm node name"):
        srun_command([Peer(node, "10.0.0.1", 8, name)], ["all_reduce_perf"], ranks_per_node=8)
