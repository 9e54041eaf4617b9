"""Bad input that used to get through (issue 53, section 6): each is one line on stderr starting
`gpuprov:`, exit 2, refused as the command line is read, before anything is created or changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import invoke

DRIVER_LINE = "gpuprov: --driver 'abc': expected a branch (580) or a release (580.95.05)"


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: "), err
    return lines[0]


@pytest.mark.parametrize("args", [
    ["stack", "--type", "p4d.24xlarge"],
    ["up", "--provider", "docker", "--count", "1", "--dry-run"],
    ["patch", "demo", "--check"],
    ["verify", "--local", "--gpus", "0"],
])
def test_driver_is_checked_as_it_is_read(capsys, gpuprov_home: Path, args: list[str]) -> None:
    """`stack --driver abc` was an internal error (ValueError, exit 1) where `up` said exit 2:
    every command taking --driver now reads it with one type and answers with the same line."""
    line = _one_line(*invoke(capsys, *args, "--driver", "abc"))
    assert line == DRIVER_LINE
    assert not gpuprov_home.exists()
