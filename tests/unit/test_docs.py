"""The README stays a five-minute read and the docs stay whole: Quick start, CI entry point, the
README's length, headline and map of docs/, every relative link resolving, role variables shown
in each role's README from its meta/argument_specs.yml."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/defaults/main.yml"))
DOCS = sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file())
HEADLINE = "gpuprov up --type p4d.24xlarge --count 4"


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


def _role_docs():
    """scripts/role-docs.py, which writes each role README's variables table from its argument_specs."""
    spec = importlib.util.spec_from_file_location("role_docs", ROOT / "scripts" / "role-docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("role", ROLES)
def test_role_variables_table_is_made_from_argument_specs(role: str) -> None:
    """Documented once, in meta/argument_specs.yml; the role's README shows them from there (the top
    README links there, holds no copy), and the table lists exactly the variables of defaults/main.yml."""
    role_docs, role_dir = _role_docs(), ROOT / "roles" / role
    readme = (role_dir / "README.md").read_text()
    assert readme.count(role_docs.BEGIN) == 1 and readme.count(role_docs.END) == 1, (
        f"roles/{role}/README.md: no variables table between the argument_specs markers")
    assert readme == role_docs.rendered(role_dir), (
        f"roles/{role}/README.md: variables table differs from meta/argument_specs.yml "
        "(run .venv/bin/python scripts/role-docs.py)")
    defaults = yaml.safe_load((role_dir / "defaults" / "main.yml").read_text())
    listed = re.findall(r"^\| `([a-z0-9_]+)` \|", role_docs.table(role_dir), re.M)
    assert sorted(listed) == sorted(defaults), f"roles/{role}/README.md: table names other variables than defaults"


def test_readme_is_a_five_minute_read_with_the_headline_on_its_first_screen() -> None:
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; at most 300 (move the rest to docs/)"
    assert any(HEADLINE in line for line in lines[:60]), f"`{HEADLINE}` not in README's first 60 lines"


def _links(text: str) -> list[str]:
    """Markdown link targets ([text](target)), outside indented and fenced code blocks."""
    prose, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("    "):
            prose.append(line)
    return re.findall(r"\]\(([^)\s]+)\)", "\n".join(prose))


def test_readme_maps_every_doc() -> None:
    section = _section(README, "Documentation")
    linked = {(ROOT / unquote(t.split("#")[0])).resolve() for t in _links(section)}
    unmapped = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert unmapped == [], f"docs/ files the README's Documentation map does not link: {unmapped}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (lower case, punctuation dropped, spaces to -)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#+ (.*)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


@pytest.mark.parametrize("doc", [ROOT / "README.md"] + [p for p in DOCS if p.suffix == ".md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _links(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not a file here
            continue
        file, _, anchor = unquote(target).partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert broken == [], f"{doc.relative_to(ROOT)}: links to no file or heading: {broken}"
