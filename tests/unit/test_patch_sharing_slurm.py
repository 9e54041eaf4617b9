"""`patch --gpu-sharing` on a Slurm cluster (issue 58): a patched node's GPUs share in a way
Slurm's configuration does not know until slurm.conf and gres.conf move on every node, so the
roll keeps each patched node drained (its Reason saying why), then the slurm play writes the new
sharing everywhere and every node held for it is resumed, by this roll or the next run of the
same patch when this one stopped. The controller's side is the stand-in of
tests/unit/slurm_standin.py (a FIXTURE: one node's state and Reason in a file, which the
slurm role's own health program reads and writes through a stand-in scontrol); the real roll,
its slurm play and Slurm's new configuration are tests/e2e/test_patch_e2e.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.core.patch import sharing_moves
from gpuprov.core.patch_plan import Request
from gpuprov.slurm.drain import HELD, is_own
from tests.unit.slurm_standin import NODE, Slurm, _health_program_runs, _roll


def test_a_held_node_stays_drained_through_its_health_until_slurm_has_the_sharing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = Slurm(tmp_path, "IDLE", "")
    roll = _roll(slurm, tmp_path)
    assert roll.drain(NODE) == (True, "")
    roll.hold(NODE)
    state, reason = slurm.get()
    assert "DRAIN" in state and reason == f"{HELD}: run 7" and is_own(reason)
    assert roll.notes[NODE] == "drained; held drained until Slurm has the new GPU sharing"
    # Its own health passes: the health program resumes only what it drained.
    _health_program_runs(slurm, tmp_path, monkeypatch, json.dumps({"services": [], "gpus": 0}))
    assert slurm.get() == (state, reason)
    # Slurm has the sharing: resumed.
    assert roll.resume_held() == [NODE]
    assert slurm.get() == ("IDLE", "") and roll.notes[NODE].endswith("resumed (Slurm has the new GPU sharing)")


def test_a_node_an_earlier_roll_held_is_resumed_by_the_next(tmp_path: Path) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", f"{HELD}: run 3")
    assert _roll(slurm, tmp_path).resume_held() == [NODE]
    assert slurm.get() == ("IDLE", "")


@pytest.mark.parametrize("reason", ["gpuprov patch failed: probes failed after the patch: gpu_answers",
                                    "gpuprov patch: run 7", "bad DIMM, ticket 42",
                                    "gpuprov health: gpu_count: 7 of 8 GPUs answer nvidia-smi"])
def test_only_nodes_held_for_the_sharing_are_resumed_by_it(tmp_path: Path, reason: str) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", reason)
    assert _roll(slurm, tmp_path).resume_held() == []
    assert slurm.get() == ("IDLE+DRAIN", reason)


def test_a_node_someone_else_drained_is_not_held(tmp_path: Path) -> None:
    slurm = Slurm(tmp_path, "IDLE+DRAIN", "bad DIMM, ticket 42")
    roll = _roll(slurm, tmp_path)
    roll.drain(NODE)
    roll.hold(NODE)
    assert slurm.get() == ("IDLE+DRAIN", "bad DIMM, ticket 42")


@pytest.mark.parametrize(("asked", "old", "new", "moves"), [
    (None, None, None, False),  # a driver patch: the sharing is not asked
    ("shard:2", None, "shard:2", True),
    ("shard:2", "shard:2", "shard:2", False),
    ("none", None, "none", False),  # no sharing recorded is none
    ("none", "mig:all-1g.10gb", "none", True),
])
def test_the_sharing_moves_only_when_asked_and_different(asked, old, new, moves) -> None:
    req = Request(gpu_sharing=asked)
    before = {"hash": "a", **({"gpu_sharing": old} if old else {})}
    after = {"hash": "b", **({"gpu_sharing": new} if new else {})}
    assert sharing_moves(req, before, after) is moves  # type: ignore[arg-type]
