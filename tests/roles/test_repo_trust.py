"""The roles' repository and archive logic on a real node container, against the
fixture repository (tests/fixtures/aptrepo.py) and the local artifact mirror:
keyring placement and fingerprint pinning, signed-by sources, conflicting entries
removed, pinned versions and holds, a driver move with fabric manager following
it, and the refusals: a key that is not the pinned one, a repository signed with
another key, a cuDNN archive whose sha256 does not match.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fixtures import aptrepo
from tests.roles.nodeplay import play, sh

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def repos():
    from gpuprov.providers.docker import bridge_gateway

    r = aptrepo.start(bridge_gateway(), ["535.288.01", "535.309.01"])
    yield r
    r.close()


@pytest.fixture(scope="module")
def node(env):
    name = f"trust-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)  # renders inventory, pins host keys
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    yield name, cdir
    run_cli("down", name, "--yes", env=env)


def driver_roles(url: str, fingerprint: str, version: str) -> list[dict]:
    return [
        {"role": "nvidia_driver", "vars": {
            "nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": url,
            "nvidia_driver_mirror_key_fingerprint": fingerprint,
            "nvidia_driver_version": version,
            "nvidia_driver_packages": ["nvidia-driver-535", "nvidia-dkms-535"],
            "nvidia_driver_package_version": f"{version}-*"}},
        {"role": "nvidia_fabricmanager", "vars": {
            "nvidia_fabricmanager_version": version,
            "nvidia_fabricmanager_package_version": f"{version}-*"}},
        {"role": "cudnn", "vars": {"cudnn_method": "packages"}},
    ]


def test_pinned_repository_install_hold_and_move(env, repos, node, tmp_path) -> None:
    name, cdir = node
    # A leftover entry for the same repository, as cuda-keyring or an old guide leaves it.
    sh(cdir, name, f"echo 'deb {repos.good_url} /' > /etc/apt/sources.list.d/cuda-debian12-x86_64.list")

    rc, stats, msgs = play(env, cdir, tmp_path, driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.288.01"))
    assert rc == 0 and stats["failures"] == 0, msgs
    keyring = sh(cdir, name, "gpg --show-keys --with-colons /etc/apt/keyrings/gpuprov-nvidia-mirror.gpg")
    assert f":{repos.fingerprint}:" in keyring
    source = sh(cdir, name, "cat /etc/apt/sources.list.d/gpuprov-nvidia-mirror.sources")
    assert f"URIs: {repos.good_url}" in source
    assert "Signed-By: /etc/apt/keyrings/gpuprov-nvidia-mirror.gpg" in source
    assert sh(cdir, name, "ls /etc/apt/sources.list.d/").split() == ["gpuprov-nvidia-mirror.sources"]
    assert not sh(cdir, name, "grep -rl 'trusted=yes' /etc/apt/ 2>/dev/null; ls /etc/apt/trusted.gpg 2>/dev/null")
    versions = sh(cdir, name, "dpkg-query -W nvidia-driver-535 nvidia-dkms-535 nvidia-fabricmanager-535 "
                              "libcudnn8 libcudnn8-dev")
    assert "nvidia-driver-535\t535.288.01-1" in versions
    assert "nvidia-fabricmanager-535\t535.288.01-1" in versions
    assert "libcudnn8-dev\t8.9.6.50-1+cuda11.8" in versions
    held = set(sh(cdir, name, "apt-mark showhold").split())
    assert {"nvidia-driver-535", "nvidia-dkms-535", "nvidia-fabricmanager-535", "libcudnn8",
            "libcudnn8-dev"} <= held

    # Converged: a second run changes nothing.
    rc, stats, msgs = play(env, cdir, tmp_path, driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.288.01"))
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)

    # A new lock moves the held driver, and fabric manager moves with it.
    rc, stats, msgs = play(env, cdir, tmp_path, driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.309.01"))
    assert rc == 0, msgs
    versions = sh(cdir, name, "dpkg-query -W nvidia-driver-535 nvidia-fabricmanager-535")
    assert "nvidia-driver-535\t535.309.01-1" in versions
    assert "nvidia-fabricmanager-535\t535.309.01-1" in versions
    assert {"nvidia-driver-535", "nvidia-fabricmanager-535"} <= set(sh(cdir, name, "apt-mark showhold").split())


def test_fabric_manager_mismatch_found_on_a_node_is_fixed(env, repos, node, tmp_path) -> None:
    name, cdir = node
    sh(cdir, name, "apt-mark unhold nvidia-fabricmanager-535 >/dev/null; "
                   "apt-get install -y -q --allow-downgrades nvidia-fabricmanager-535=535.288.01-1 >/dev/null")
    assert "535.288.01-1" in sh(cdir, name, "dpkg-query -W nvidia-fabricmanager-535")
    rc, stats, msgs = play(env, cdir, tmp_path, driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.309.01"))
    assert rc == 0 and stats["changed"] >= 1, msgs
    assert "535.309.01-1" in sh(cdir, name, "dpkg-query -W nvidia-fabricmanager-535")


def test_key_that_is_not_the_pinned_one_is_refused(env, repos, node, tmp_path) -> None:
    _name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, driver_roles(repos.good_url, repos.other_fingerprint,
                                                         "535.309.01")[:1])
    assert rc != 0
    assert "refusing to trust" in msgs and repos.good_url in msgs and repos.other_fingerprint in msgs


def test_repository_signed_with_another_key_is_refused(env, repos, node, tmp_path) -> None:
    _name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, driver_roles(repos.wrong_url, repos.fingerprint,
                                                         "535.309.01")[:1])
    assert rc != 0
    assert f"repository {repos.wrong_url} did not verify" in msgs, msgs


def test_cudnn_archive_with_wrong_checksum_is_refused_before_unpacking(env, node, tmp_path) -> None:
    name, cdir = node
    mirror = os.environ.get("GPUPROV_ARTIFACT_MIRROR")
    if not mirror:
        pytest.fail("GPUPROV_ARTIFACT_MIRROR is not set: run through `make test` (scripts/artifact-mirror.sh)")
    rc, _, msgs = play(env, cdir, tmp_path, [{"role": "cudnn", "vars": {
        "cudnn_method": "tarball",
        "cudnn_tarball_url": f"{mirror}/cudnn/cudnn-linux-x86_64-8.9.6.50_cuda11-archive.tar.xz",
        "cudnn_tarball_sha256": "0" * 64}}])
    assert rc != 0 and re.search(r"checksum.*did not match|did not match", msgs), msgs
    assert not sh(cdir, name, "ls /usr/local/cuda-11.8/include/cudnn_version.h /var/cache/gpuprov/*.tar.xz 2>/dev/null")
