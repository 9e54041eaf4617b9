"""The linters, as one unit of `make test`: ruff, yamllint, ansible-lint's production profile
(which syntax-checks every playbook, molecule's converge playbooks included) and mypy on the
package.

They are a test file so that they run on one worker beside the suite's other units rather than
before all of them (about two minutes of one core on a 2-core AMD EPYC). `make lint` runs this file
alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LINTERS = {
    "ruff": ["ruff", "check", "gpuprov", "tests", "benchmarks"],
    "yamllint": ["yamllint", "-s", "."],
    "ansible-lint": ["ansible-lint", "--profile", "production", "--offline", "playbooks", "roles"],
    # The package's annotations ([tool.mypy] in pyproject.toml): about 10 s of one core, cold.
    "mypy": ["mypy"],
}


@pytest.mark.parametrize("linter", list(LINTERS))
def test_the_tree_passes(linter: str) -> None:
    command, *args = LINTERS[linter]
    proc = subprocess.run([str(BIN / command), *args], cwd=ROOT, capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL, timeout=900)
    assert proc.returncode == 0, f"{linter} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
