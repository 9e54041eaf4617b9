"""The README stays true: Quick start, CI entry point, role variables in sync with defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/defaults/main.yml"))


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^##+ {re.escape(heading)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"README has no '{heading}' section"
    return match.group(1)


def test_quick_start_is_exactly_make_demo_and_make_test() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", _section(README, "Quick start"), re.S)
    assert blocks and blocks[0].split("\n")[:-1] == ["make demo", "make test"]


def test_ci_runs_the_readme_test_command() -> None:
    lines = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
             if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))]
    assert lines == ["exec make test"]


def _table_vars(text: str, role: str) -> dict[str, str]:
    rows = re.findall(rf"^\| `({role}_[a-z0-9_]+)` \| (.*?) (?<!\\)\|", text, re.M)
    return dict(rows)


@pytest.mark.parametrize("role", ROLES)
def test_role_variables_documented_with_their_defaults(role: str) -> None:
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())
    role_readme = (ROOT / "roles" / role / "README.md").read_text()
    for where, text in (("role README", role_readme), ("README", README)):
        documented = _table_vars(text, role)
        assert set(documented) == set(defaults), f"{where} table drifted from defaults/main.yml"
        for name, value in defaults.items():
            shown = documented[name].strip("`").replace("\\|", "|")  # a pipe escaped in a table
            assert yaml.safe_load(shown if shown != '""' else "''") == value, (where, name, shown)
