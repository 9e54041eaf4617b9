"""The local power service (gpuprov/providers/docker/power.py) end to end short of Slurm: the
power program slurmctld runs (roles/slurm/files/gpuprov-slurm-power) sends a resume over real
HTTP, the service checks it and boots the dynamic node's container, with what it is given to
join (the munge key, 0400 munge; the controller's address for `slurmd --conf-server`; the
unit's drop-in; slurmctld masked); the provider never takes it for one of its nodes; a suspend
removes it. With Slurm: tests/e2e/test_elastic_e2e.py. What slurmd does with those files on slurmctld 22.05.8 is the recording resume-by-hand.txt
(tests/fixtures/recordings/slurm-22.05-debian12).

FIXTURE: the image is the plain node image with a `munge` user added (the cluster's baked image
has munge installed; the plain one has no such user), built here from that image alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles
from gpuprov.providers.docker import PROVIDER, bridge_gateway, power
from gpuprov.providers.docker.engine import docker
from gpuprov.providers.docker.options import DEFAULT_IMAGE
from gpuprov.slurm import elastic
from gpuprov.slurm.power_http import PowerService

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "slurm" / "files" / "gpuprov-slurm-power"
FIXTURE_IMAGE = "gpuprov-test/munge-user:bookworm"
CLUSTER = "pwr"


@pytest.fixture(scope="module")
def image() -> str:
    docker("build", "--quiet", "-t", FIXTURE_IMAGE, "-", timeout=300,
           input=f"FROM {DEFAULT_IMAGE}\nRUN useradd --system --no-create-home munge\n".encode())
    return FIXTURE_IMAGE


@pytest.fixture
def munge_key(tmp_path: Path) -> Path:
    path = tmp_path / "munge.key"
    path.write_bytes(b"M" * 1024)
    path.chmod(0o600)
    return path


def _in(cname: str, *argv: str) -> str:
    return docker("exec", cname, *argv).stdout.decode().strip()


def _program(tmp_path: Path, action: str, url: str, key: bytes, hostlist: str) -> subprocess.CompletedProcess:
    (tmp_path / "power.key").write_bytes(key)
    (tmp_path / "power.json").write_text(json.dumps({"url": url, "key_file": str(tmp_path / "power.key")}))
    name = {"resume": "gpuprov-slurm-resume", "suspend": "gpuprov-slurm-suspend"}[action]
    shutil.copy(PROGRAM, tmp_path / name)
    return subprocess.run([sys.executable, "-I", "-S", str(tmp_path / name), "--config", str(tmp_path / "power.json"),
                           hostlist], capture_output=True, text=True, timeout=60, check=False)


def _wait(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.5)
    return False


def test_a_resume_boots_the_dynamic_node_with_what_it_joins_by_and_a_suspend_removes_it(
        image: str, munge_key: Path, tmp_path: Path) -> None:
    key = elastic.new_key()

    def act(action: str, names: tuple[str, ...]) -> None:
        if action == "resume":
            for name in names:
                power.boot(CLUSTER, name, image, "172.17.0.2", munge_key)
        else:
            power.remove(list(names))

    with PowerService(bridge_gateway(), CLUSTER, 2, key, act) as service:
        try:
            sent = _program(tmp_path, "resume", service.url, key, "pwr-dy-[1-2]")
            assert sent.returncode == 0, sent.stderr
            cname = power.container_of("pwr-dy-2")
            assert _wait(lambda: docker("ps", "-q", "--filter", f"name=^{cname}$", check=False).stdout.strip()), \
                service.failed
            assert _in(cname, "hostname") == "pwr-dy-2"
            assert _in(cname, "cat", elastic.SLURMD_DEFAULTS) == "SLURMD_OPTIONS=--conf-server 172.17.0.2 -b"
            assert "ConditionPathExists=\n" in _in(cname, "cat", elastic.SLURMD_DROP_IN) + "\n"
            # slurmctld is masked: a node baked from the controller never runs it.
            assert _in(cname, "readlink", "/etc/systemd/system/slurmctld.service") == "/dev/null"
            assert _in(cname, "stat", "-c", "%a %U %s", elastic.MUNGE_KEY) == "400 munge 1024"
            # No way in but Slurm's: no SSH port published, no key of the cluster given.
            assert not docker("port", cname, check=False).stdout.strip()
            # Slurm's, not one of the nodes gpuprov bootstraps.
            assert PROVIDER.describe(CLUSTER, [], ClusterFiles(tmp_path / "cluster")) == []
            assert [t.action for t in service.taken] == ["resume"] and not service.refused

            # A replay of the same request, and one signed with another key, do nothing.
            stranger = _program(tmp_path, "suspend", service.url, elastic.new_key(), "pwr-dy-[1-2]")
            assert stranger.returncode == 1 and "bad signature" in stranger.stderr

            gone = _program(tmp_path, "suspend", service.url, key, "pwr-dy-[1-2]")
            assert gone.returncode == 0, gone.stderr
            assert _wait(lambda: not docker("ps", "-aq", "--filter", f"label=gpuprov.cluster={CLUSTER}",
                                            check=False).stdout.strip())
            assert [t.action for t in service.taken] == ["resume", "suspend"] and not service.failed
        finally:
            power.remove(elastic.dynamic_names(CLUSTER, 2))


def test_an_image_without_munge_is_refused_and_leaves_nothing(munge_key: Path) -> None:
    with pytest.raises(GpuprovError, match="has no munge user: a dynamic node boots from an image baked"):
        power.boot(CLUSTER, "pwr-dy-1", DEFAULT_IMAGE, "172.17.0.2", munge_key)
    assert not docker("ps", "-aq", "--filter", f"name=^{power.container_of('pwr-dy-1')}$").stdout.strip()
