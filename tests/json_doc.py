"""Reading docs/json-output.md, the `--output json` reference (helpers of the JSON shape tests
in tests/unit and tests/cli, not tests)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "json-output.md"


# -- the document ---------------------------------------------------------------------------------
def documented() -> dict[str, dict[str, str]]:
    """{command: {path: type}} from each `## `gpuprov COMMAND`` section's table (sections
    without one, such as `inventory` whose JSON is Ansible's, are left out)."""
    out: dict[str, dict[str, str]] = {}
    command = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## `gpuprov (\w+)", line)
        if heading:
            command = heading.group(1)
            out[command] = {}
        elif line.startswith("| `") and command is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            path = _normal(cells[0].strip("`"))
            assert path not in out[command], f"{command}: {path} documented twice"
            out[command][path] = cells[1]
    return {command: rows for command, rows in out.items() if rows}


def _normal(path: str) -> str:
    """``hosts.<node>`` and ``hosts.<host>`` name the same thing: any map key."""
    return re.sub(r"<[^>]*>", "<>", path)


def _paths(value: Any, path: str = "") -> set[str]:
    """The document's paths of a JSON value (map keys of ``hosts``-like maps become ``<>``)."""
    out: set[str] = set()
    if isinstance(value, list):
        for item in value:
            out |= _paths(item, path + "[]")
    elif isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            out.add(here)
            out |= _paths(item, here)
    return out
