"""Shared by the unit tests of the programs gpuprov ships to nodes (the pull agent, the
manifest's node program, the slurm role's health program): loading the agent and the health
program as the node runs them (files, not package modules), and a dpkg status file for a
temporary root."""

from __future__ import annotations

import importlib.machinery
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


# The slurm role's node health program (slurmd's HealthCheckProgram): a file without a suffix.
HEALTH_PROGRAM = Path(__file__).resolve().parents[2] / "roles" / "slurm" / "files" / "gpuprov-slurm-health"


def load_health_program(module_name: str = "gpuprov_slurm_health") -> ModuleType:
    """The slurm role's health program loaded under ``module_name`` (its own copy each call)."""
    loader = importlib.machinery.SourceFileLoader(module_name, str(HEALTH_PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def write_status(root: Path, packages: dict[str, tuple[str, str]]) -> None:
    """``root``'s dpkg status: each package as (selection, version)."""
    (root / "var/lib/dpkg/status").write_text("".join(
        STATUS.format(name=n, want=w, version=v) for n, (w, v) in packages.items()))
