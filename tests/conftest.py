"""Shared fixtures: an isolated state directory, and the real engines the e2e tests need."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """The probes' markers (gpu, driver, ...) are declared in the probes' own pytest.ini, read
    when gpuprov runs them; the unit tests import the probe modules under this suite's
    configuration, so declare the same markers here (one list, read from that file)."""
    from gpuprov.probes.run import probe_groups

    for group in probe_groups():
        config.addinivalue_line("markers", f"{group}: a group of gpuprov's probes")


ROOT = Path(__file__).resolve().parent.parent
GPUPROV = [sys.executable, "-m", "gpuprov"]


@pytest.fixture
def gpuprov_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpuprov-home"
    monkeypatch.setenv("GPUPROV_HOME", str(home))
    # This machine's own settings file (make settings) stays out of library tests.
    monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "no-settings.toml"))
    return home


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for an end-to-end module: its own state directory, real engines."""
    require_docker()
    home = tmp_path_factory.mktemp("gpuprov-home")
    # Baked images are local to the engine, not to a state directory: each module bakes into
    # a repository of its own, so no other module (or a run beside this one) boots from them.
    return {**os.environ, "GPUPROV_HOME": str(home), "ANSIBLE_NOCOLOR": "1",
            "GPUPROV_BAKED_REPO": f"gpuprov-test/baked-{secrets.token_hex(4)}"}


def require_docker() -> None:
    """The e2e and molecule tests need a Docker engine and the node image.

    `make test` provides both (scripts/host-setup.sh). Outside CI a missing
    engine skips with the reason; in CI (CI=true) it fails, so a broken
    set-up can never pass as green.
    """
    problems = []
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        problems.append("no Docker engine reachable (run `make host-setup`)")
    elif subprocess.run(["docker", "image", "inspect", "gpuprov/node:bookworm"],
                        capture_output=True, check=False).returncode != 0:
        problems.append("node image gpuprov/node:bookworm missing (run `make host-setup`)")
    if problems:
        if os.environ.get("CI"):
            pytest.fail("; ".join(problems))
        pytest.skip("; ".join(problems))


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 600,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    """The real command line, in a subprocess, as a user runs it."""
    proc = subprocess.run([*GPUPROV, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"gpuprov {' '.join(args)} exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    return proc


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """gpuprov's entry point in this process: (exit code, stdout, stderr)."""
    from gpuprov.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@contextmanager
def unbootstrapped_cluster(env, prefix: str, count: int = 2) -> Iterator[tuple[str, list[str]]]:
    """A local cluster of ``count`` nodes up with --no-bootstrap, answering SSH (the name and
    its node names); removed on the way out."""
    name = f"{prefix}-{secrets.token_hex(3)}"
    try:
        run_cli("up", "--provider", "docker", "--count", str(count), "--no-bootstrap", "--name", name, env=env,
                check=True)
        deadline = time.monotonic() + 60  # --no-bootstrap returns once the containers run
        while run_cli("exec", name, "--", "true", env=env).returncode != 0 and time.monotonic() < deadline:
            time.sleep(1)
        yield name, [f"{name}-node-{i}" for i in range(1, count + 1)]
    finally:
        run_cli("down", name, "--yes", env=env)
