"""Every role's molecule scenarios, run for real (docker driver, systemd node image).

Every scenario shares one base config (.config/molecule/config.yml: driver,
platform, provisioner, the probes as testinfra verifier, the test sequence with
its idempotence and check steps); its own molecule.yml holds only what differs.
The meta-tests below keep it so without Docker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT
from tests.molecule.scenarios import (
    BASE_CONFIG,
    DEBIAN12_ONLY,
    DEBIAN13,
    EXTENDED,
    MATRIX,
    SCENARIOS,
    node_name,
    run_scenario,
    unit_of,
)

# Steps every scenario's effective sequence runs, in this order (house rule: every
# role idempotent and honouring --check).
REQUIRED_STEPS = ("converge", "idempotence", "check", "verify")


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: expected a mapping"
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Molecule's merge of a scenario onto its base config (molecule/util.py merge_dicts:
    mappings merged key by key, anything else, lists included, replaced whole)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(out.get(key), dict) and isinstance(value, dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def repeats_of_base(base: dict[str, Any], scenario: dict[str, Any], path: str = "") -> list[str]:
    """What a scenario file sets that the base config owns and it does not change.

    A value equal to the base's repeats it; ``platforms`` is never a scenario's (a list:
    setting it replaces the shared platform whole, so its definition would be in two
    places).
    """
    found = []
    for key, value in scenario.items():
        where = f"{path}{key}"
        if where == "platforms":
            found.append("platforms (the platform is the base config's alone)")
        elif key not in base:
            continue
        elif isinstance(base[key], dict) and isinstance(value, dict):
            found += repeats_of_base(base[key], value, f"{where}.")
        elif base[key] == value:
            found.append(f"{where} (same as the base config)")
    return found


def missing_steps(config: dict[str, Any]) -> list[str]:
    """The required steps an effective config's test sequence lacks or runs out of order."""
    sequence = list((config.get("scenario") or {}).get("test_sequence") or [])
    missing, at = [], -1
    for step in REQUIRED_STEPS:
        later = [i for i, s in enumerate(sequence) if s == step and i > at]
        if later:
            at = later[0]
        else:
            missing.append(step)
    return missing


def test_base_config_holds_the_shared_settings() -> None:
    base = _load(BASE_CONFIG)
    assert base["driver"]["name"] == "docker"
    assert len(base["platforms"]) == 1
    assert base["platforms"][0]["image"] == "${GPUPROV_MOLECULE_IMAGE:-gpuprov/node:bookworm}"
    assert base["verifier"]["name"] == "testinfra"
    assert not missing_steps(base), missing_steps(base)


@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{r}:{s}" for r, s in SCENARIOS])
def test_a_molecule_node_needs_the_free_space_a_local_node_needs(role: str, scenario: str) -> None:
    """A molecule node shares this machine's disk as a local node does: the preflight asks it
    for gpuprov's local-node figure, never a real node's (the 40 GiB a busy suite can go under)."""
    from gpuprov.ansible.inventory import LOCAL_NODE_FREE_GIB

    own = _load(ROOT / "roles" / role / "molecule" / scenario / "molecule.yml")
    merged = _merge(_load(BASE_CONFIG), own)
    assert merged["provisioner"]["inventory"]["group_vars"]["all"]["gpu_preflight_root_free_gib"] == LOCAL_NODE_FREE_GIB


@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{r}:{s}" for r, s in SCENARIOS])
def test_scenario_holds_only_what_differs(role: str, scenario: str) -> None:
    path = ROOT / "roles" / role / "molecule" / scenario / "molecule.yml"
    own = _load(path)
    repeated = repeats_of_base(_load(BASE_CONFIG), own)
    assert not repeated, f"{path.relative_to(ROOT)} repeats the base config: {repeated}"
    missing = missing_steps(_merge(_load(BASE_CONFIG), own))
    assert not missing, f"{role}:{scenario}: its test sequence lacks {missing} (in this order)"


def test_molecule_finds_the_base_config_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """`molecule test` in a role's directory loads it with no flag (docs/development.md)."""
    util = pytest.importorskip("molecule.util")
    if not (ROOT / ".git").exists():
        pytest.skip("no .git here: molecule looks for .config/molecule/ at the VCS root")
    monkeypatch.chdir(ROOT / "roles" / "cudnn")
    assert util.lookup_config_file(".config/molecule/config.yml") == str(BASE_CONFIG)


def test_merge_is_molecules() -> None:
    """The merge above is the one molecule applies (its own function, when installed)."""
    util = pytest.importorskip("molecule.util")
    base, own = _load(BASE_CONFIG), _load(ROOT / "roles" / "cudnn" / "molecule" / "default" / "molecule.yml")
    assert _merge(base, own) == util.merge_dicts(base, own)


def test_meta_checks_catch_a_repeating_or_short_scenario() -> None:
    base = _load(BASE_CONFIG)
    assert repeats_of_base(base, {"driver": {"name": "docker"}}) == ["driver.name (same as the base config)"]
    assert repeats_of_base(base, {"platforms": [{"name": "x"}]})
    assert repeats_of_base(base, {"scenario": {"test_sequence": base["scenario"]["test_sequence"]}})
    assert not repeats_of_base(base, {"verifier": {"options": {"m": "cuda"}}})
    short = [s for s in base["scenario"]["test_sequence"] if s != "idempotence"]
    assert missing_steps(_merge(base, {"scenario": {"test_sequence": short}})) == ["idempotence"]
    assert missing_steps({"scenario": {"test_sequence": ["verify", "check", "idempotence", "converge"]}})


def test_every_scenario_has_a_node_of_its_own() -> None:
    # The scenarios are separate xdist groups: two that shared a container name would create,
    # converge into and destroy one node between them (a CI failure: cuda:default destroyed
    # cuda:archives' node mid-converge, "OCI runtime exec failed").
    names = [node_name(role, scenario, os) for role, scenario, os in MATRIX]
    assert len(set(names)) == len(names) == len(MATRIX)
    assert node_name("cuda", "default") != node_name("cuda", "archives")
    assert node_name("slurm", "default", "debian13") == "gpuprov-molecule-slurm-debian13"


def test_every_scenario_runs_on_debian_13_or_says_why_not() -> None:
    names = {f"{role}:{scenario}" for role, scenario in SCENARIOS}
    assert set(DEBIAN13) | set(DEBIAN12_ONLY) == names and not set(DEBIAN13) & set(DEBIAN12_ONLY)
    assert all(len(why) > 40 for why in DEBIAN12_ONLY.values())
    assert {unit_of(r, s, os) for r, s, os in MATRIX if os == "debian13"} == {f"{n}:debian13" for n in DEBIAN13}


@pytest.mark.parametrize("role", sorted({role for role, _ in SCENARIOS}))
def test_a_roles_meta_claims_the_debian_releases_its_scenarios_run_on(role: str) -> None:
    """Galaxy meta lists the Debian releases the role's scenarios prove (trixie may also be
    proven by tests/e2e/test_debian13_e2e.py, as the meta's comment then says)."""
    meta = ROOT / "roles" / role / "meta" / "main.yml"
    platforms = _load(meta)["galaxy_info"]["platforms"]
    debian = next(p["versions"] for p in platforms if p["name"] == "Debian")
    assert "bookworm" in debian
    if any(r == role and os == "debian13" for r, _, os in MATRIX):
        assert "trixie" in debian
        assert "molecule scenario runs on bookworm only" not in meta.read_text()
    else:
        assert "trixie" not in debian or "test_debian13_e2e.py" in meta.read_text()


def test_every_role_has_a_scenario() -> None:
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file())
    assert roles and roles == sorted({role for role, _ in SCENARIOS})


# The scenarios themselves, each a unit of work of its own for the suite's workers
# (tests/conftest.py: the longest start first, so that the workers end together).
# Debian 13's, where the OS matrix runs them there too (tests/molecule/scenarios.py DEBIAN13).
@pytest.mark.parametrize(("role", "scenario", "os_name"), [
    pytest.param(role, scenario, os, id=unit_of(role, scenario, os),
                 marks=[pytest.mark.xdist_group(f"molecule:{unit_of(role, scenario, os)}")]
                 + ([pytest.mark.extended(why=EXTENDED[unit_of(role, scenario, os)])]
                    if unit_of(role, scenario, os) in EXTENDED else []))
    for role, scenario, os in MATRIX])
def test_molecule_scenario(role: str, scenario: str, os_name: str, tmp_path: Path, fixture_repo) -> None:
    run_scenario(role, scenario, tmp_path, fixture_repo, os_name)


def test_the_extended_scenarios_are_scenarios_of_the_matrix() -> None:
    """A scenario left to `make test-extended` names a unit that exists (a misspelt one would
    leave `make test` running it and the extended suite without it)."""
    assert set(EXTENDED) <= {unit_of(r, s, os) for r, s, os in MATRIX}
    assert all(len(why) > 80 for why in EXTENDED.values())
