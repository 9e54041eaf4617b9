"""Running one role's molecule scenario for real (docker driver, systemd node image): the
helpers of tests/molecule/test_scenarios.py (the fixture repository is in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, require_docker

SCENARIOS = sorted(
    (p.parent.parent.parent.name, p.parent.name)
    for p in (ROOT / "roles").glob("*/molecule/*/molecule.yml")
)
# Molecule finds it on its own at the repository root; the runner passes it anyway,
# so a copy of the tree without its .git (molecule's root search) runs the same.
BASE_CONFIG = ROOT / ".config" / "molecule" / "config.yml"


def node_name(role: str, scenario: str) -> str:
    """The scenario's node container: gpuprov-molecule-ROLE, or -ROLE-SCENARIO past `default`."""
    name = "gpuprov-molecule-" + role.replace("_", "-")
    return name if scenario == "default" else f"{name}-{scenario.replace('_', '-')}"


def run_scenario(role: str, scenario: str, tmp_path: Path, fixture_repo) -> None:
    require_docker()
    if not os.environ.get("GPUPROV_ARTIFACT_MIRROR"):
        raise AssertionError("GPUPROV_ARTIFACT_MIRROR is not set: run through `make test` or `make molecule`")
    env = dict(os.environ)
    env["GPUPROV_FIXTURE_REPO_URL"] = fixture_repo.good_url
    env["GPUPROV_FIXTURE_REPO_FPR"] = fixture_repo.fingerprint
    mirror = env.get("GPUPROV_REGISTRY_MIRROR", "")
    if mirror and not env.get("GPUPROV_REGISTRY_DIGESTS"):
        # The fixture registry serves its own image under the lock's names: the roles must
        # pull the digests it serves (read from it here), not NVIDIA's from the lock.
        from gpuprov import stack
        from tests.fixtures import registry

        env["GPUPROV_REGISTRY_DIGESTS"] = json.dumps(registry.digests(
            mirror.split("://", 1)[-1].rstrip("/"), list(stack.resolve(None, source="distro").base_images)))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["NO_COLOR"] = "1"
    # The node's container name (the base config's platform): one per scenario, since the
    # scenarios of one role are separate xdist groups and may run side by side.
    node = node_name(role, scenario)
    env["GPUPROV_MOLECULE_NODE"] = node
    # What the leading destroy the shared sequence no longer runs made sure of: no container
    # of this name (one left by an interrupted run), and molecule's state of this run alone
    # (a state left saying "created" would make molecule skip its create step).
    subprocess.run(["docker", "rm", "--force", "--volumes", node], capture_output=True, check=False)
    env["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_path / "molecule-state")
    log = tmp_path / "molecule.log"
    with log.open("w") as fh:
        proc = subprocess.run(
            ["molecule", "--base-config", str(BASE_CONFIG), "test", "--scenario-name", scenario],
            cwd=ROOT / "roles" / role, env=env, stdout=fh, stderr=subprocess.STDOUT,
            check=False, timeout=1800,
        )
    text = log.read_text()
    assert proc.returncode == 0, f"molecule test {role}:{scenario} failed:\n{text[-6000:]}"
    for step in ("create", "converge", "idempotence", "check", "verify"):
        assert f"{step}: Executed: Successful" in text, f"{step} did not run:\n{text[-3000:]}"
