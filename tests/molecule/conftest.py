"""The fixture repository the molecule scenarios share (one per worker: the scenarios are
units of work of their own, run between other files' tests)."""

from __future__ import annotations

import pytest

from tests.conftest import require_docker
from tests.fixtures import aptrepo


@pytest.fixture(scope="session")
def fixture_repo():
    """FIXTURE: the signed repository with NVIDIA's package names, for scenarios that need one."""
    require_docker()
    from gpuprov.providers.docker import bridge_gateway

    repos = aptrepo.start(bridge_gateway(), ["535.288.01", "535.309.01", "580.159.04"])
    yield repos
    repos.close()
