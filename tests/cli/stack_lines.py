"""Shared by the CLI tests of the stack lines (test_cuda_cli.py, test_stack_os_cli.py): the
CLI run in-process, the one-line exit-2 refusal, a hosts file, and the store and home as they
are (to show a refused command created nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.cli.app import main
from gpuprov.state import Store


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def one_line_exit_2(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gpuprov: ") and needle in lines[0], lines[0]


def hosts_file(tmp_path: Path) -> str:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: gpu01\n    address: 192.0.2.1\n    user: ubuntu\n")
    return str(hosts)


def state_of(home: Path) -> list[tuple[str, str, str, str, str]]:
    """Every cluster as the store holds it, runs included, and the files under the home."""
    store = Store()
    return [(c.name, json.dumps(c.spec, sort_keys=True), json.dumps(c.lock, sort_keys=True), c.state,
             json.dumps([r.id for r in store.runs(c.name)])) for c in store.list_clusters()] + [
        ("file", str(p.relative_to(home)), "", "", "") for p in sorted(home.rglob("*")) if p.is_file()]
