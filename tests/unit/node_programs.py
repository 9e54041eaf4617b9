"""Shared by the unit tests of the programs gpuprov ships to nodes (the pull agent, the
manifest's node program): loading the agent as the node runs it (a file, not a package
module), and a dpkg status file for a temporary root."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from gpuprov.pull import bundle as bundle_mod

STATUS = """Package: {name}
Status: {want} ok installed
Maintainer: FIXTURE
Architecture: amd64
Version: {version}
Description: FIXTURE package

"""


def load_agent(module_name: str) -> ModuleType:
    """gpuprov/pull/node/agent.py loaded under ``module_name`` (each test file its own copy)."""
    spec = importlib.util.spec_from_file_location(module_name, bundle_mod.NODE_DIR / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_status(root: Path, packages: dict[str, tuple[str, str]]) -> None:
    """``root``'s dpkg status: each package as (selection, version)."""
    (root / "var/lib/dpkg/status").write_text("".join(
        STATUS.format(name=n, want=w, version=v) for n, (w, v) in packages.items()))
