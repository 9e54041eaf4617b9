"""Every role's molecule scenarios, run for real (docker driver, systemd node image).

The scenario's own sequence includes the idempotence and check steps and the
shared probes as its testinfra verifier.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_docker
from tests.fixtures import aptrepo

SCENARIOS = sorted(
    (p.parent.parent.parent.name, p.parent.name)
    for p in (ROOT / "roles").glob("*/molecule/*/molecule.yml")
)


def test_every_role_has_a_scenario() -> None:
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
    assert roles and roles == sorted({role for role, _ in SCENARIOS})


@pytest.fixture(scope="module")
def fixture_repo():
    """FIXTURE: the signed repository with NVIDIA's package names, for scenarios that need one."""
    require_docker()
    from gpuprov.providers.docker import bridge_gateway

    repos = aptrepo.start(bridge_gateway(), ["535.288.01", "535.309.01"])
    yield repos
    repos.close()


@pytest.mark.parametrize(("role", "scenario"), SCENARIOS, ids=[f"{r}:{s}" for r, s in SCENARIOS])
def test_molecule_scenario(role: str, scenario: str, tmp_path: Path, fixture_repo) -> None:
    require_docker()
    if not os.environ.get("GPUPROV_ARTIFACT_MIRROR"):
        pytest.fail("GPUPROV_ARTIFACT_MIRROR is not set: run through `make test` or `make molecule`")
    env = dict(os.environ)
    env["GPUPROV_FIXTURE_REPO_URL"] = fixture_repo.good_url
    env["GPUPROV_FIXTURE_REPO_FPR"] = fixture_repo.fingerprint
    mirror = env.get("GPUPROV_REGISTRY_MIRROR", "")
    if mirror and not env.get("GPUPROV_REGISTRY_DIGESTS"):
        # The fixture registry serves its own image under the lock's names: the roles must
        # pull the digests it serves (read from it here), not NVIDIA's from the lock.
        import json

        from gpuprov import stack
        from tests.fixtures import registry

        env["GPUPROV_REGISTRY_DIGESTS"] = json.dumps(registry.digests(
            mirror.split("://", 1)[-1].rstrip("/"), list(stack.resolve(None, source="distro").base_images)))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["NO_COLOR"] = "1"
    log = tmp_path / "molecule.log"
    with log.open("w") as fh:
        proc = subprocess.run(
            ["molecule", "test", "--scenario-name", scenario],
            cwd=ROOT / "roles" / role, env=env, stdout=fh, stderr=subprocess.STDOUT,
            check=False, timeout=1800,
        )
    text = log.read_text()
    assert proc.returncode == 0, f"molecule test {role}:{scenario} failed:\n{text[-6000:]}"
    for step in ("converge", "idempotence", "verify"):
        assert f"{step}: Executed: Successful" in text, f"{step} did not run:\n{text[-3000:]}"
