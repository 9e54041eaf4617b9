#!/usr/bin/env python3
"""Write each role README's variables table from the role's meta/argument_specs.yml.

Role variables are documented once, in meta/argument_specs.yml (type, default, description:
what `ansible-doc -t role -r roles ROLE` shows); each README shows the main entry point's
options between the markers below. Run after editing an argument spec:

    .venv/bin/python scripts/role-docs.py            # rewrite the tables
    .venv/bin/python scripts/role-docs.py --check    # exit 1 naming each README out of date

tests/unit/test_docs.py fails when a table differs from what this gives, and
tests/unit/test_role_argument_specs.py when a spec's defaults differ from defaults/main.yml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- argument_specs: begin (scripts/role-docs.py writes this table) -->"
END = "<!-- argument_specs: end -->"


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading Ansible's `!unsafe` (a string never templated) as that string."""


SpecLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def load(path: Path):
    return yaml.load(path.read_text(), Loader=SpecLoader)  # a SafeLoader, plus !unsafe


def specs(role_dir: Path) -> dict:
    return (load(role_dir / "meta" / "argument_specs.yml") or {}).get("argument_specs") or {}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(role_dir: Path) -> str:
    """The Markdown table of the main entry point's options, in the spec's order."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, option in (specs(role_dir)["main"].get("options") or {}).items():
        if "default" in option:
            default = f"`{_cell(json.dumps(option['default'], ensure_ascii=False))}`"
        else:
            default = "required" if option.get("required") else "none"
        description = option.get("description") or ""
        if isinstance(description, list):
            description = " ".join(description)
        rows.append(f"| `{name}` | {default} | {_cell(description)} |")
    return "\n".join(rows)


def rendered(role_dir: Path) -> str:
    """The role's README with the table between the markers made from argument_specs."""
    text = (role_dir / "README.md").read_text()
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{role_dir / 'README.md'}: no '{BEGIN}' ... '{END}' markers")
    return f"{head}{BEGIN}\n{table(role_dir)}\n{END}{tail}"


def roles() -> list[Path]:
    return sorted(p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: role-docs.py [--check]", file=sys.stderr)
        return 2
    stale = []
    for role_dir in roles():
        readme = role_dir / "README.md"
        text = rendered(role_dir)
        if text != readme.read_text():
            stale.append(str(readme.relative_to(ROOT)))
            if not argv:
                readme.write_text(text)
    if argv and stale:
        print("out of date (run scripts/role-docs.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
