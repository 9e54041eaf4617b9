"""gpuprov installed from its wheel alone, with no checkout: the wheel is built from this tree,
installed into a folder of its own (its dependencies are this environment's) and run from a
directory outside the checkout. The AWS and static providers work from it; the docker
provider's node image build travels in it (package data) and its error names that copy."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, require_docker

NODE_IMAGE_FILES = ("build-node-image.sh", "lib.sh")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed in)."""
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(out / "dist"), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    (wheel,) = (out / "dist").glob("gpuprov-*.whl")
    site = out / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return wheel, site


def _run(site: Path, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(site), "GPUPROV_HOME": str(cwd / "home"), "NO_COLOR": "1",
               "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_wheel_alone_carries_its_content_and_runs_aws_and_static(installed, tmp_path: Path) -> None:
    wheel, site = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("gpuprov/share/playbooks/site.yml", "gpuprov/share/roles/rdma/tasks/main.yml",
                   "gpuprov/probes/pytest.ini", "gpuprov/data/stack.toml",
                   *(f"gpuprov/share/node-image/{name}" for name in NODE_IMAGE_FILES)):
        assert needed in names, needed
    for name in NODE_IMAGE_FILES:  # the very scripts of the checkout
        assert (site / "gpuprov/share/node-image" / name).read_bytes() == (ROOT / "scripts" / name).read_bytes()

    where = _run(site, tmp_path, "-c", "import gpuprov, gpuprov.paths as p; print(gpuprov.__file__, p.roles_dir())")
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(site) for p in where.stdout.split()), where.stdout  # not the checkout's
    assert _run(site, tmp_path, "-m", "gpuprov", "--help").returncode == 0
    stack = _run(site, tmp_path, "-m", "gpuprov", "stack", "--type", "p4d.24xlarge")
    assert stack.returncode == 0 and "p4d.24xlarge" in stack.stdout and "A100" in stack.stdout, stack.stderr
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    gpu01:\n      ansible_host: 127.0.0.1\n      ansible_user: ubuntu\n")
    plan = _run(site, tmp_path, "-m", "gpuprov", "up", "--provider", "static", "--hosts", "hosts.yml",
                "--name", "wheel", "--dry-run")
    assert plan.returncode == 0 and "1 existing host(s) from hosts.yml" in plan.stderr, plan.stdout + plan.stderr


def test_the_wheels_docker_provider_names_its_own_node_image_build(installed, tmp_path: Path) -> None:
    require_docker()
    _, site = installed
    missing = f"gpuprov-wheel-test/missing:{hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12]}"
    # --no-baked: an image baked on this machine before (gpuprov image bake) would be booted instead.
    up = _run(site, tmp_path, "-m", "gpuprov", "up", "--provider", "docker", "--count", "1", "--name", "wheel",
              "--no-baked", "--dry-run", env={"GPUPROV_NODE_IMAGE": missing})
    script = site / "gpuprov/share/node-image/build-node-image.sh"
    assert up.returncode == 2 and len(up.stderr.strip().splitlines()) == 1, up.stdout + up.stderr
    assert f"node image {missing} not found" in up.stderr and f"`bash {script}`" in up.stderr, up.stderr
    assert not (tmp_path / "home" / "clusters" / "wheel").exists()
    # The copy it names runs (it sources lib.sh beside it): bash parses both.
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert subprocess.run(["bash", "-n", str(script.with_name("lib.sh"))], check=False).returncode == 0
