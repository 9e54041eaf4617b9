"""Python that other files run: every `from gpuprov... import NAME` and `python -m gpuprov...` in
a shell script, the Makefile, a playbook or a molecule file names what exists. The import test
(test_import_graph.py) reads only .py files; a module moved without these lines following broke
`make test`'s set-up once (scripts/registry.sh's `from gpuprov import stack`, 2026-12-02)."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FROM_IMPORT = re.compile(r"\bfrom (gpuprov(?:\.\w+)*) import ([\w, ]+)")
RUN_MODULE = re.compile(r"-m (gpuprov(?:\.\w+)+)")
SUFFIXES = (".sh", ".yml", ".yaml", ".j2", ".toml", ".cfg")


def _files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in listed.split() if f.endswith(SUFFIXES) or Path(f).name == "Makefile"]


def _references() -> list[tuple[str, str, str | None]]:
    """(file, module, name or None) for each embedded import."""
    found = []
    for path in _files():
        text = path.read_text(errors="replace")
        rel = str(path.relative_to(ROOT))
        for module, names in FROM_IMPORT.findall(text):
            found += [(rel, module, n.strip()) for n in names.split(",") if n.strip()]
        found += [(rel, module, None) for module in RUN_MODULE.findall(text)]
    return found


def test_there_are_embedded_imports_to_check() -> None:
    files = {f for f, _, _ in _references()}
    assert {"scripts/registry.sh", "tests/molecule/resolve_lock.yml", "Makefile"} <= files


@pytest.mark.parametrize(("where", "module", "name"), _references())
def test_each_names_what_exists(where: str, module: str, name: str | None) -> None:
    loaded = importlib.import_module(module)
    if name is not None and not hasattr(loaded, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: `from gpuprov.lock import stack`


def test_a_moved_module_is_caught() -> None:
    with pytest.raises(ImportError):
        importlib.import_module("gpuprov.stack")
