"""Docstrings and docs that are true (issue 55): every dotted ``gpuprov.`` name in a docstring,
a comment, the README or docs/ names a module, or a module's attribute, that exists. (Moves
leave such names behind: `gpuprov.converge` for gpuprov.core.provision.) The Docker labels
gpuprov writes on containers and images (`gpuprov.cluster`, `gpuprov.lock.*`) are labels, not
modules: taken from the code that writes them."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from gpuprov.providers.docker import engine
from gpuprov.providers.docker.images import LOCK_FIELDS

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"(?<![\w/.-])gpuprov(?:\.[A-Za-z_]\w*)+")
# Each label by its whole name: `gpuprov.lock.driver` is an image's label, while gpuprov.lock.stack
# is the package gpuprov/lock/'s module, and a name below it must resolve.
LABELS = frozenset({engine.LABEL, engine.IMAGE_LABEL, engine.NODE_LABEL,
                    *(f"{engine.IMAGE_LABEL}.{field}" for field in LOCK_FIELDS)})


def _resolves(name: str) -> bool:
    if name in LABELS:
        return True
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def _names() -> list[tuple[str, str]]:
    """(where, name) for each dotted name in gpuprov's docstrings and comments and in the docs."""
    found = []
    for path in sorted((ROOT / "gpuprov").rglob("*.py")):
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        docs = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(text))
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        comments = [line.split("#", 1)[1] for line in text.splitlines() if line.strip().startswith("#")]
        found += [(where, n.rstrip(".")) for chunk in docs + comments for n in NAME.findall(chunk)]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += [(doc.name, n.rstrip(".")) for n in NAME.findall(doc.read_text())]
    return sorted(set(found))


NAMES = _names()


def test_the_names_are_found() -> None:
    assert len(NAMES) > 50 and ("gpuprov/results/shapes.py", "gpuprov.core.up_verdict") in NAMES


@pytest.mark.parametrize(("where", "name"), NAMES, ids=[f"{w}:{n}" for w, n in NAMES])
def test_a_dotted_name_resolves(where: str, name: str) -> None:
    assert _resolves(name), f"{where}: {name} names nothing in gpuprov"


def test_a_stale_name_is_caught() -> None:
    for stale in ("gpuprov.converge", "gpuprov.core.converge", "gpuprov.core.results.serialise"):
        assert not _resolves(stale), stale
    assert _resolves("gpuprov.core.verify.verify") and _resolves("gpuprov.lock.driver")
    assert _resolves("gpuprov.lock.stack.resolve_types") and not _resolves("gpuprov.lock.stack.no_such_rule")
    assert not _resolves("gpuprov.stack") and not _resolves("gpuprov.slurm.scheduler.nothing")
