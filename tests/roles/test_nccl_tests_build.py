"""The nccl_tests role on a real node container: NVIDIA nccl-tests' release archive downloaded
(from the artifact mirror, or its URL), checked against its pinned sha256 before anything is
installed, built with make MPI=1 against the NCCL the cuda role left and Debian's Open MPI into
/opt/nccl-tests/VERSION, and found where gpuprov's standard health level looks for
all_reduce_perf; a second run and a --check run change nothing; a wrong archive is refused with
nothing installed; a source without NCCL (distro) builds nothing and says why.

FIXTURE: the archive is not NVIDIA's nccl-tests (which cannot be downloaded here, and needs
nvcc and a CUDA toolkit to build): it is tests/roles/fixtures/nccl-tests/ (its README), laid
out like NVIDIA's release archive (top directory nccl-tests-VERSION/, a Makefile taking CUDA_HOME,
NCCL_HOME, MPI=1, MPI_HOME, building build/all_reduce_perf and its siblings), compiled with a
fixture nvcc that hands over to gcc, against a fixture nccl.h that names the lock's NCCL.
The Open MPI, make and g++ it builds with are Debian's real packages.
"""

from __future__ import annotations

import hashlib
import io
import secrets
import tarfile
from pathlib import Path

import pytest
import yaml

from gpuprov.health import gather
from gpuprov.lock import stack
from tests.conftest import ROOT, run_cli
from tests.fixtures import aptrepo
from tests.roles.nodeplay import copy_in, play, sh

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "NVIDIA's nccl-tests release built with MPI on a node (about 3 minutes of two cores); in `make test` "
    "the nccl_tests role's scenario runs its tasks, a re-run and check mode (roles/nccl_tests/molecule/default)"))]

FIXTURE = Path(__file__).parent / "fixtures" / "nccl-tests"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "nccl_tests" / "defaults" / "main.yml").read_text())
VERSION = DEFAULTS["nccl_tests_version"]
NCCL = stack.resolve("docker-node", source="distro").as_dict()["nccl"]
IN_NODE = "/opt/gpuprov-fixture-nccl-tests"
ARCHIVE = f"nccl-tests-{VERSION}.tar.gz"


def _archive() -> bytes:
    """The fixture tree as NVIDIA's release archive lays it out (nccl-tests-VERSION/...)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        top = tarfile.TarInfo(f"nccl-tests-{VERSION}")
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(top)
        for path in sorted((FIXTURE / "archive").rglob("*")):
            info = tar.gettarinfo(str(path), f"nccl-tests-{VERSION}/{path.relative_to(FIXTURE / 'archive')}")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """An artifact mirror serving the fixture archive at nccl-tests/NAME: (mirror, sha256)."""
    from gpuprov.providers.docker import bridge_gateway

    directory = tmp_path_factory.mktemp("nccl-tests-mirror")
    data = _archive()
    (directory / "nccl-tests").mkdir()
    (directory / "nccl-tests" / ARCHIVE).write_bytes(data)
    server = aptrepo.Server(directory, bridge_gateway())
    yield server.url, hashlib.sha256(data).hexdigest()
    server.close()


@pytest.fixture(scope="module")
def node(env, tmp_path_factory):
    """A node with the fixture CUDA_HOME (bin/nvcc) and NCCL_HOME (include/nccl.h)."""
    name = f"nccl-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap", "--no-baked",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    major, minor, patch = NCCL.split(".")
    homes = tmp_path_factory.mktemp("nccl-tests-homes")
    (homes / "nccl" / "include").mkdir(parents=True)
    (homes / "nccl" / "include" / "nccl.h").write_text(
        "/* FIXTURE nccl.h (gpuprov tests, tests/roles/fixtures/nccl-tests/README.md): not NVIDIA's;\n"
        " * only the release defines, the lock's NCCL. */\n"
        f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n")
    sh(cdir, name, f"mkdir -p {IN_NODE}")
    copy_in(name, homes / "nccl", f"{IN_NODE}/nccl")
    copy_in(name, FIXTURE / "cuda", f"{IN_NODE}/cuda")
    sh(cdir, name, f"chmod 0755 {IN_NODE}/cuda/bin/nvcc")
    yield name, cdir
    run_cli("down", name, "--yes", env=env)


def role(**override) -> list[dict]:
    return [{"role": "nccl_tests", "vars": {
        "nccl_tests_source": "mirror", "nccl_tests_nccl_version": NCCL,
        "nccl_tests_cuda_home": f"{IN_NODE}/cuda", "nccl_tests_nccl_home": f"{IN_NODE}/nccl", **override}}]


def _nothing_installed(cdir: Path, name: str) -> None:
    assert not sh(cdir, name, "ls -d /opt/nccl-tests /var/cache/gpuprov/nccl-tests-* 2>/dev/null")
    assert "install ok installed" not in sh(cdir, name, "dpkg -s openmpi-bin 2>/dev/null | grep '^Status'")


def test_a_source_without_nccl_builds_nothing_and_says_why(env, node, tmp_path) -> None:
    name, cdir = node
    said: list[str] = []
    rc, stats, msgs = play(env, cdir, tmp_path, role(nccl_tests_source="distro"), messages=said)
    assert rc == 0 and stats["failures"] == 0, (stats, msgs)
    assert any(f"nccl-tests {VERSION} not built: the package source distro" in m and "\n" not in m
               for m in said), said
    _nothing_installed(cdir, name)


def test_no_nccl_where_the_lock_has_one_stops_with_the_reason(env, node, tmp_path) -> None:
    name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, role(nccl_tests_nccl_home="/nonexistent"))
    assert rc != 0 and f"needs NCCL {NCCL}" in msgs and "there is no /nonexistent/include/nccl.h" in msgs, msgs
    _nothing_installed(cdir, name)


def test_a_hand_built_checkout_at_the_prefix_is_not_replaced(env, served, node, tmp_path) -> None:
    name, cdir = node
    mirror, digest = served
    sh(cdir, name, "mkdir -p /opt/nccl-tests/build && touch /opt/nccl-tests/build/all_reduce_perf")
    try:
        rc, _, msgs = play(env, cdir, tmp_path, role(nccl_tests_artifact_mirror=mirror, nccl_tests_sha256=digest))
        assert rc != 0 and "/opt/nccl-tests/build exists and is not a link" in msgs, msgs
        assert sh(cdir, name, "ls /opt/nccl-tests").split() == ["build"]
    finally:
        sh(cdir, name, "rm -rf /opt/nccl-tests")
    _nothing_installed(cdir, name)


def test_an_archive_other_than_the_pinned_one_is_refused_and_nothing_installed(env, served, node,
                                                                               tmp_path) -> None:
    name, cdir = node
    mirror, _ = served
    wrong = hashlib.sha256(b"not the pinned archive").hexdigest()
    rc, _, msgs = play(env, cdir, tmp_path, role(nccl_tests_url=f"{mirror}nccl-tests/{ARCHIVE}",
                                                 nccl_tests_sha256=wrong))
    assert rc != 0 and "did not match" in msgs, msgs
    _nothing_installed(cdir, name)


def test_the_pinned_release_builds_with_mpi_where_health_looks_once(env, served, node, tmp_path) -> None:
    name, cdir = node
    mirror, digest = served
    # From the artifact mirror: nccl_tests_url points nowhere, so the mirror is what is used.
    pinned = role(nccl_tests_artifact_mirror=mirror, nccl_tests_sha256=digest,
                  nccl_tests_url="http://127.0.0.1:9/nowhere.tar.gz")
    rc, stats, msgs = play(env, cdir, tmp_path, pinned)
    assert rc == 0 and stats["failures"] == 0, msgs
    assert sh(cdir, name, "readlink /opt/nccl-tests/build").strip() == f"/opt/nccl-tests/{VERSION}/build"
    assert sh(cdir, name, f"cat /opt/nccl-tests/{VERSION}/.gpuprov-nccl-tests").split() == [VERSION, digest]
    assert not sh(cdir, name, "ls /var/cache/gpuprov/nccl-tests-* 2>/dev/null")
    # gpuprov's standard level finds and runs it (its own command, past the GPU guard: the node
    # has no NVIDIA device).
    command = gather.STANDARD["nccl_tests"]
    assert command.startswith(gather._GPU_GUARD)
    out = sh(cdir, name, command.removeprefix(gather._GPU_GUARD))
    assert "# nccl-tests version FIXTURE" in out and "# Collective test starting: all_reduce_perf" in out, out
    assert f"# nccl.h: NCCL {NCCL}" in out, out
    assert "# MPI: Open MPI v4" in out, out  # built with MPI=1 against Debian 12's Open MPI 4.1
    for test in ("all_gather_perf", "sendrecv_perf"):
        assert f"starting: {test}" in sh(cdir, name, f"/opt/nccl-tests/build/{test}")
    rc, stats, msgs = play(env, cdir, tmp_path, pinned)
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)
    rc, stats, msgs = play(env, cdir, tmp_path, pinned, check=True)
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)
