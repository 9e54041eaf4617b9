"""The rdma role's EFA installer path on a real node container: downloaded from a
mirror-able URL, checked against its pinned sha256 before anything runs, run
non-interactively with the GPU options; a wrong checksum is refused and the
installer never runs.

FIXTURE: the archive is not AWS's installer (which cannot be downloaded here):
it has the installer's layout (aws-efa-installer/efa_installer.sh) and a script
that records the options it was given and writes the version file the real
installer writes (/opt/amazon/efa_installed_packages).
"""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from pathlib import Path

import pytest

from gpuprov.lock import stack
from tests.conftest import run_cli
from tests.fixtures import aptrepo
from tests.roles.nodeplay import play, sh

pytestmark = pytest.mark.e2e

VERSION = "1.34.0"
FIXTURE_INSTALLER = f"""#!/bin/sh
# FIXTURE EFA installer (gpuprov tests): records its options, writes the version file.
set -eu
mkdir -p /opt/amazon
echo "$*" > /opt/amazon/efa-fixture-args
printf '# EFA installer version: {VERSION}\\n# Debug packages installed: no\\n' > /opt/amazon/efa_installed_packages
"""


def _archive(directory: Path) -> tuple[str, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = FIXTURE_INSTALLER.encode()
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    name = f"aws-efa-installer-{VERSION}.tar.gz"
    (directory / name).write_bytes(buf.getvalue())
    return name, hashlib.sha256(buf.getvalue()).hexdigest()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from gpuprov.providers.docker import bridge_gateway

    directory = tmp_path_factory.mktemp("efa-mirror")
    name, digest = _archive(directory)
    server = aptrepo.Server(directory, bridge_gateway())
    yield f"{server.url}{name}", digest
    server.close()


@pytest.fixture(scope="module")
def node(env):
    name = f"efa-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap", "--no-baked",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)
    yield name, Path(env["GPUPROV_HOME"]) / "clusters" / name
    run_cli("down", name, "--yes", env=env)


def efa_role(url: str, digest: str) -> list[dict]:
    return [{"role": "rdma", "vars": {
        "rdma_fabric": "efa", "rdma_efa_installer_version": VERSION,
        # What the lock says the installer brings (roles/gpuprov_lock/vars/main.yml maps it).
        "rdma_aws_ofi_nccl_version": stack.data()["efa"]["aws_ofi_nccl"],
        "rdma_efa_installer_url": url, "rdma_efa_installer_sha256": digest}}]


def test_wrong_checksum_is_refused_and_nothing_runs(env, served, node, tmp_path) -> None:
    name, cdir = node
    url, _ = served
    rc, _, msgs = play(env, cdir, tmp_path, efa_role(url, "f" * 64))
    assert rc != 0 and "did not match" in msgs, msgs
    assert not sh(cdir, name, "ls /opt/amazon/efa-fixture-args /opt/amazon/efa_installed_packages 2>/dev/null")


def test_pinned_installer_runs_with_the_gpu_options_once(env, served, node, tmp_path) -> None:
    name, cdir = node
    url, digest = served
    rc, stats, msgs = play(env, cdir, tmp_path, efa_role(url, digest))
    assert rc == 0 and stats["failures"] == 0, msgs
    # -g: GPU (aws-ofi-nccl); a container node cannot load the kernel module (--skip-kmod).
    assert sh(cdir, name, "cat /opt/amazon/efa-fixture-args").split() == [
        "-y", "-g", "--skip-limit-conf", "--skip-kmod"]
    rc, stats, msgs = play(env, cdir, tmp_path, efa_role(url, digest))
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)
