"""The second half of the roles' molecule scenarios (tests/molecule/test_scenarios.py runs the
first half and the meta-tests): two files, so that the suite's two workers share them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.molecule.scenarios import SECOND_HALF, run_scenario


@pytest.mark.parametrize(("role", "scenario"), SECOND_HALF, ids=[f"{r}:{s}" for r, s in SECOND_HALF])
def test_molecule_scenario(role: str, scenario: str, tmp_path: Path, fixture_repo) -> None:
    run_scenario(role, scenario, tmp_path, fixture_repo)
