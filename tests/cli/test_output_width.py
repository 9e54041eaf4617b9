"""Tables fit the output (gpuprov/cli/table.py): piped, COLUMNS, else 100 columns; the key column
and the paths a user copies are never cut; `types`' why goes under its row when it cannot fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuprov.state import NodeRecord, Store
from tests.conftest import invoke

ARTIFACTS = "/var/lib/gpuprov-state/runs/rack/20261202T101112Z-provision-0123abcd/artifacts/ansible"


def widest(text: str) -> int:
    """The longest line of the tables in ``text`` (a note under a table is one sentence a line)."""
    return max(len(line) for line in text.splitlines() if line[:1] in "┏┃┡│└ " or "─" in line)


def test_types_for_training_at_120_columns_keeps_every_name_and_puts_why_under_its_row(
        capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = invoke(capsys, "types", "--for", "training", "--max-price", "40")
    assert code == 0 and widest(out) <= 120, out
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith(("p4d.", "p4de.", "g4dn.", "g5.", "g6", "p3"))]
    assert rows[0].split()[0] == "p4d.24xlarge" and "p4de.24xlarge" in [r.split()[0] for r in rows]
    assert "…" not in out
    # Each row on one line, its why whole on the next.
    why = lines[lines.index(rows[0]) + 1]
    assert why.strip() == ("why: training: NVSwitch and EFA first, then $/GPU-hour; NVSwitch: all-to-all "
                           "NVLink; EFA x4; $21.96/h <= $40.00")
    assert len(lines) <= 2 * len(rows) + 6


def test_types_in_a_wide_output_keep_why_in_the_table(capsys, gpuprov_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = invoke(capsys, "types", "--for", "training", "--max-price", "40")
    assert code == 0 and "┃ why " in out and "\n    why: " not in out
    assert any(line.startswith("│ p4d.24xlarge ") and line.rstrip().endswith("$21.96/h <= $40.00 │")
               for line in out.splitlines())


@pytest.mark.parametrize("columns, limit", [(None, 100), ("150", 150), ("120", 120)])
def test_piped_output_honours_columns_else_100(capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                columns: str | None, limit: int) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    code, out, _ = invoke(capsys, "types", "--for", "training")
    assert code == 0 and widest(out) <= limit and "p4d.24xlarge" in out, out
    setting = "http://10.0.0.5:3142/" + "a-long-path/" * 2
    Store().create_cluster("rack", "static", {"options": {"settings": {
        "apt_proxy": {"value": setting, "from": "GPUPROV_APT_PROXY"},
        "artifact_mirror": {"value": "http://10.0.0.5:8089 " + "with words that wrap " * 8,
                            "from": "GPUPROV_ARTIFACT_MIRROR"}}}})
    code, out, _ = invoke(capsys, "settings", "rack")
    assert code == 0 and widest(out) <= limit and setting in out and "GPUPROV_ARTIFACT_MIRROR" in out, out


def test_status_never_cuts_the_artifacts_path(capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    store.create_cluster("rack", "static", {"instance_type": "g5.xlarge"})
    store.replace_nodes("rack", [NodeRecord(name="rack-node-1", id="i-0123456789abcdef0", address="192.0.2.1",
                                            ssh_port=22, user="root", state="reachable", zone="static",
                                            instance_type="g5.xlarge")])
    store.finish_run(store.start_run("rack", "provision", ARTIFACTS), True, {})
    for columns, terminal in (("80", True), ("120", True), ("80", False), ("250", False)):
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setattr(sys.stdout, "isatty", lambda terminal=terminal: terminal)  # rich: COLUMNS
        code, out, _ = invoke(capsys, "status", "rack")
        assert code == 0 and ARTIFACTS in out and "i-0123456789abcdef0" in out and "rack-node-1" in out, out
        assert "…" not in out
