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

from tests.suite_strategy import SUITE_STRATEGY


def pytest_configure(config: pytest.Config) -> None:
    """The probes' markers (gpu, driver, ...) are declared in the probes' own pytest.ini, read
    when gpuprov runs them; the unit tests import the probe modules under this suite's
    configuration, so declare the same markers here (one list, read from that file)."""
    from gpuprov.probes.run import probe_groups

    for group in probe_groups():
        config.addinivalue_line("markers", f"{group}: a group of gpuprov's probes")


ROOT = Path(__file__).resolve().parent.parent
GPUPROV = [sys.executable, "-m", "gpuprov"]

# -- the extended suite ---------------------------------------------------------------------------
# A test marked ``@pytest.mark.extended(why=...)`` proves a variant that `make test`'s time on a
# two-core machine does not have room for (a second line of a stack, a second transport), beside a
# proof of the same code in `make test`; `why` names both. `make test` skips it with that reason;
# `make test-extended` (GPUPROV_TEST_EXTENDED=1, `-m extended`) runs exactly these.
EXTENDED = os.environ.get("GPUPROV_TEST_EXTENDED") == "1"


def skip_extended(items: list[pytest.Item]) -> None:
    if EXTENDED:
        return
    for item in items:
        mark = item.get_closest_marker("extended")
        if mark is not None:
            why = mark.kwargs.get("why") or (mark.args[0] if mark.args else "")
            assert why, f"{item.nodeid}: @pytest.mark.extended needs why=..."
            item.add_marker(pytest.mark.skip(reason=f"extended suite (`make test-extended`): {why}"))


@pytest.fixture
def gpuprov_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpuprov-home"
    monkeypatch.setenv("GPUPROV_HOME", str(home))
    # This machine's own settings file (make settings) stays out of library tests.
    monkeypatch.setenv("GPUPROV_CONFIG", str(tmp_path / "no-settings.toml"))
    return home


@pytest.fixture
def no_aws(gpuprov_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No AWS configuration at all, so boto3 finds no region and no credentials: every AWS_*
    variable removed, HOME and the AWS config and credentials files empty, no metadata service.
    The empty AWS config file is returned (a test may write a profile in it)."""
    for name in [v for v in os.environ if v.startswith("AWS_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "user-home"
    home.mkdir()
    config, credentials = tmp_path / "aws-config", tmp_path / "aws-credentials"
    config.write_text("")
    credentials.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return config


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for an end-to-end module: its own state directory, real engines."""
    require_docker()
    home = tmp_path_factory.mktemp("gpuprov-home")
    # Baked images are local to the engine, not to a state directory: each module bakes into
    # a repository of its own, so no other module (or a run beside this one) boots from them.
    return {**os.environ, "GPUPROV_HOME": str(home), "ANSIBLE_NOCOLOR": "1",
            "GPUPROV_ANSIBLE_STRATEGY": SUITE_STRATEGY,
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
    from gpuprov.cli.app import main

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


# -- the schedule of `make test`'s workers (pytest-xdist, --dist loadgroup; Makefile TEST_WORKERS) --
# A unit of work goes to one worker whole: by default a test file (its module fixtures, a
# cluster most of the time, are made once); a test may name another unit with
# @pytest.mark.xdist_group (each molecule scenario is a unit of its own: tests/molecule). The
# units start longest first (then in collection order), so that the long ones run beside each
# other and the short ones fill in at the end: the workers end together. Only the order of
# the figures matters. Seconds on the 2-core test machine: "CI", make test's --durations on the
# last CI run; "here", the unit run alone while two or three other suites ran on the machine
# (2026-11-27). A run of make test prints every unit's figure at its end (below): copy them
# here. A unit not named gets its directory's figure, so a new end-to-end file or molecule
# scenario starts early.
UNIT_SECONDS = {
    # The node from scratch first; the unit grown from its image (tests/e2e/scratch_image.py) waits
    # for that image, so it comes once the other worker has had about as long as the node takes
    # to be baked (AMD EPYC, 2026-12-01: the units above it, about 1300 s).
    "tests/e2e/test_docker_cluster.py": 1830,  # CI 2313 (2026-11-28) less its real driver move (opt-in since: 480)
    "tests/e2e/test_patch_e2e.py": 1104,  # CI (2026-11-28); alone 726; AMD EPYC 625 (2026-12-01)
    "tests/e2e/test_cluster_faults.py": 428,  # fresh clone; AMD EPYC 402
    "tests/roles/test_repo_trust.py": 296,  # AMD EPYC (2026-12-01)
    "tests/e2e/test_baked_cluster.py": 290,  # placed, not measured (see above)
    "tests/e2e/test_elastic_e2e.py": 230,  # here 224 alone (2026-12-06), most of it Slurm's waits
    "tests/roles/test_lock_vs_host.py": 243,  # AMD EPYC
    "tests/aws/test_ec2_headline.py": 217,  # AMD EPYC
    "tests/unit/test_lint.py": 120,  # ruff, yamllint, ansible-lint: once before every unit, now beside them
    "molecule:nvidia_driver:default": 170,  # here 163 (the mirror FIXTURE since 2026-11-28; 582 with the real DKMS build)
    "tests/e2e/test_pull_e2e.py": 300,  # fresh clone 215 (2026-11-28) and provision --via pull (about 80)
    "tests/e2e/test_unreachable.py": 261,  # here
    "molecule:slurm:default": 200,  # here 165 to 264
    # The OS matrix (2026-11-28): a fresh clone of e7c9b12 with these figures gave slurm 241, rdma 98,
    # gpu_preflight 80 and test_cuda13_e2e.py 438, the two workers ending 0.1 min apart (kept as run).
    "molecule:slurm:default:debian13": 200,
    "molecule:rdma:default:debian13": 110,
    "molecule:gpu_preflight:default:debian13": 90,
    "molecule:nvidia_fabricmanager:default": 228,  # CI
    "molecule:cuda:default": 209,  # CI
    "molecule:cuda:archives": 240,  # here 315 beside two helpers' e2e runs (load 11 on 2 cores)
    "tests/e2e/test_slurm_e2e.py": 260,  # here 203 (7 tests, two nodes, rdma and slurm plays)
    "tests/e2e/test_monitor_e2e.py": 170,  # here
    "tests/e2e/test_static_onprem.py": 134,  # here 105 (72 in a fresh clone before its Slurm test)
    "tests/e2e/test_recorded_node.py": 123,  # here
    "molecule:dcgm:default": 110,  # here (CI 185 while its converge ran the driver play too)
    "tests/e2e/test_health_e2e.py": 71,  # here
    "tests/e2e/test_pull_aws_e2e.py": 100,  # fresh clone 61 (2026-11-28) and provision --via pull (about 40)
    "tests/e2e/test_debian13_e2e.py": 5,  # its node opt-in since 2026-11-28 (make test-debian13: CI 847)
    "tests/e2e/test_cuda13_e2e.py": 320,  # here 310 alone (2026-11-28): up on 11.8, patch --cuda 13, verify
}
DEFAULT_SECONDS = {"tests/e2e/": 200, "molecule:": 120, "tests/roles/": 60, "tests/aws/": 40}


def schedule_unit(item: pytest.Item) -> str:
    """The unit of work ``item`` belongs to: its xdist_group, else its file."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    return item.nodeid.split("::", 1)[0]


def _set_nodeid(item: pytest.Item, nodeid: str) -> None:
    """``item``'s id, where this pytest keeps it (pytest 9: a NodeId in ``_id``)."""
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        item._nodeid = nodeid


def unit_seconds(unit: str) -> int:
    if unit in UNIT_SECONDS:
        return UNIT_SECONDS[unit]
    return next((s for prefix, s in DEFAULT_SECONDS.items() if unit.startswith(prefix)), 0)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in a unit (its file's, unless it names one), the units longest first; the
    tests of one unit keep their order (a file's tests run in file order).

    Under --dist loadgroup the unit is also written into each test's id ("ID@UNIT", what
    xdist's scheduler groups by). xdist 3.8 writes it to ``item._nodeid``, which pytest 9 no
    longer reads (its ids live in ``item._id``): without this every test of a file would go
    its own way (two workers each making the file's cluster, a test on one worker depending on
    a test run on the other)."""
    skip_extended(items)
    first: dict[str, int] = {}
    # (xdist tells its workers with the option "loadgroup"; the controller has "dist")
    grouped = bool(getattr(config.option, "loadgroup", False)) or getattr(config.option, "dist", None) == "loadgroup"
    for index, item in enumerate(items):
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(schedule_unit(item)))
        unit = schedule_unit(item)
        if grouped and not item.nodeid.endswith(f"@{unit}"):
            _set_nodeid(item, f"{item.nodeid}@{unit}")
        first.setdefault(unit, index)
    items.sort(key=lambda item: (-unit_seconds(schedule_unit(item)), first[schedule_unit(item)]))


# What each unit took (setup, call and teardown of its tests), printed at the end of the run:
# the figures UNIT_SECONDS wants (benchmarks/schedule.py --seconds reads these lines), and each
# worker's sum, so that a run shows whether its workers ended together.
UNIT_TOOK: dict[str, float] = {}
WORKER_TOOK: dict[str, float] = {}
UNIT_OF: dict[str, str] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    UNIT_OF.update((item.nodeid, schedule_unit(item)) for item in session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _, at, group = report.nodeid.rpartition("@")
    if not at or "]" in group:  # no xdist group suffix (--dist loadgroup adds "@UNIT")
        group = UNIT_OF.get(report.nodeid, report.nodeid.split("::", 1)[0])
    UNIT_TOOK[group] = UNIT_TOOK.get(group, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    key = getattr(worker, "id", "this process")
    WORKER_TOOK[key] = WORKER_TOOK.get(key, 0.0) + report.duration


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


_STARTED = pytest.StashKey[float]()


def pytest_terminal_summary(terminalreporter) -> None:
    if not UNIT_TOOK or not any(s >= 30 for s in UNIT_TOOK.values()):
        return
    terminalreporter.section("seconds per unit of work (30 s and more)")
    for unit, took in sorted(UNIT_TOOK.items(), key=lambda kv: -kv[1]):
        if took >= 30:
            terminalreporter.write_line(f"{unit} {took:.0f}")
    for worker, took in sorted(WORKER_TOOK.items()):
        terminalreporter.write_line(f"# {worker}: {took / 60:.1f} min of tests")
    from tests.suite_budget import report, speed_probe

    started = terminalreporter.config.stash.get(_STARTED, None)
    tests_s = time.monotonic() - started if started is not None else None
    for line in report(UNIT_TOOK, tests_s, os.environ.get("GPUPROV_SUITE_STARTED"),
                       strategy=SUITE_STRATEGY, speed_s=speed_probe()):
        terminalreporter.write_line(line)
