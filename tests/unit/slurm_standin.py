"""A FIXTURE Slurm controller for the unit tests of `patch`'s drains (gpuprov.slurm.drain): one
node's state and Reason in a file, which the roll (through its controller calls) and a stand-in
scontrol on PATH (the slurm role's own health program calls it) both read and write. Shared by
tests/unit/test_review4_slurm.py and test_patch_sharing_slurm.py; the real controller is the
e2e units' (tests/e2e/test_patch_e2e.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuprov.providers import ClusterFiles
from gpuprov.slurm.drain import SlurmDrains
from gpuprov.state import NodeRecord
from tests.unit.node_programs import load_health_program

NODE = "n1"


class Slurm:
    """One node's state and Reason as the controller holds them, in a file that both the roll
    (through its controller calls) and a stand-in scontrol on PATH read and write."""

    def __init__(self, root: Path, state: str, reason: str) -> None:
        self.file = root / "slurm-state.json"
        self.log = root / "scontrol.log"
        self.set(state, reason)
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(f"""#!/usr/bin/env python3
import json, sys
state = json.load(open({str(self.file)!r}))
with open({str(self.log)!r}, "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
if sys.argv[1] == "show":
    print(f"NodeName={NODE} State={{state['state']}} Reason={{state['reason']}}")
elif sys.argv[1] == "update":
    words = dict(w.split("=", 1) for w in sys.argv[2:])
    state["state"] = {{"drain": "IDLE+DRAIN", "resume": "IDLE"}}[words["state"]]
    state["reason"] = words.get("reason", "" if words["state"] == "resume" else state["reason"])
    json.dump(state, open({str(self.file)!r}, "w"))
""")
        (bin_dir / "scontrol").chmod(0o755)
        self.bin = bin_dir

    def set(self, state: str, reason: str) -> None:
        self.file.write_text(json.dumps({"state": state, "reason": reason}))

    def get(self) -> tuple[str, str]:
        found = json.loads(self.file.read_text())
        return found["state"], found["reason"]

    def controller(self, *argv: str) -> str:
        """What SlurmDrains asks of the controller, answered from the same state."""
        state, reason = self.get()
        if argv[0] == "sinfo":
            shown = "drained" if "DRAIN" in state else state.lower()
            return f"{shown}|{reason or 'none'}\n"
        if argv[0] == "squeue":
            return ""
        words = dict(w.split("=", 1) for w in argv[4:])
        assert argv[:4] == ("sudo", "-n", "scontrol", "update") and words["NodeName"] == NODE
        self.set("IDLE+DRAIN" if words["State"] == "DRAIN" else "IDLE",
                 words.get("Reason", "" if words["State"] == "RESUME" else reason))
        return ""


def _roll(slurm: Slurm, tmp_path: Path) -> SlurmDrains:
    controller = NodeRecord(name="c-1", id="1", address="10.0.0.1", ssh_port=22, user="gpuprov",
                            state="running", zone="static")
    drains = SlurmDrains(controller, ClusterFiles(tmp_path), {NODE: NODE}, run="run 7", sleep=lambda s: None)
    drains._on_controller = slurm.controller  # type: ignore[method-assign]
    return drains


def _health_program_runs(slurm: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str) -> None:
    monkeypatch.setenv("PATH", f"{slurm.bin}:{os.environ['PATH']}")
    path = tmp_path / "gpuprov-health.json"
    path.write_text(config)
    program = load_health_program()
    monkeypatch.setattr(program, "CONFIG", str(path))
    monkeypatch.setattr(program.socket, "gethostname", lambda: f"{NODE}.cluster")
    assert program.main() == 0
