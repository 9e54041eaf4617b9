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
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment for an end-to-end module: its own state directory, real engines."""
    require_docker()
    home = tmp_path_factory.mktemp("gpuprov-home")
    # Baked images are local to the engine, not to a state directory: each module bakes into
    # a repository of its own, so no other module (or a run beside this one) boots from them,
    # and removes them when it ends (about 640 MB each: a run's images left behind filled the
    # disk of the machine CI runs on, run after run).
    repo = f"gpuprov-test/baked-{secrets.token_hex(4)}"
    yield {**os.environ, "GPUPROV_HOME": str(home), "ANSIBLE_NOCOLOR": "1",
           "GPUPROV_ANSIBLE_STRATEGY": SUITE_STRATEGY, "GPUPROV_BAKED_REPO": repo}
    from tests.e2e.scratch_image import handed_over

    if not handed_over(repo):  # the from-scratch unit's image, still the grown unit's to use
        remove_images(repo)


def remove_images(repo: str) -> None:
    """Every image of the Docker repository ``repo`` (a module's baked images), by id."""
    listed = subprocess.run(["docker", "images", "--quiet", "--no-trunc", repo],
                            capture_output=True, text=True, check=False)
    ids = sorted(set(listed.stdout.split()))
    if ids:
        subprocess.run(["docker", "image", "rm", "--force", *ids], capture_output=True, check=False)


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
# the figures matters. Seconds of one worker on the 2-core Intel Xeon kind, two workers: the mean of
# the two last fresh-clone runs (2026-12-06: ci6 and stop 71's CI, make test's "seconds per unit"
# lines, which print every unit of 30 s and more: copy them here). A unit not named gets its
# directory's figure, so a new end-to-end file or molecule scenario starts early.
SCRATCH_UNIT = "tests/e2e/test_docker_cluster.py"  # the node from scratch (tests/e2e/scratch_image.py)
GROWN_UNIT = "tests/e2e/test_baked_cluster.py"  # the cluster grown from its image
# The from-scratch unit publishes its image this share of the way through (setup 547 of 613 s).
SCRATCH_IMAGE_SHARE = 0.9
UNIT_SECONDS = {
    SCRATCH_UNIT: 600,
    "tests/e2e/test_patch_e2e.py": 350,  # with the GPU sharing roll (58) and accounting on its third node (59)
    GROWN_UNIT: 285,  # placed by place_grown_unit, not by this figure
    "tests/e2e/test_elastic_e2e.py": 230,  # most of it Slurm's waits
    "tests/e2e/test_cluster_faults.py": 215,  # with an operator's own key (issue 57)
    "tests/e2e/test_slurm_e2e.py": 250,  # accounting, topology, spot requeue, accounts, a controller reboot (56, 59)
    "tests/aws/test_ec2_headline.py": 140,
    "tests/roles/test_repo_trust.py": 127,
    "tests/e2e/test_pull_aws_e2e.py": 92,
    "molecule:cuda:archives": 92,
    "tests/aws/test_replace_failed.py": 78,
    "molecule:monitoring:default": 64,
    "tests/unit/test_lint.py": 63,  # ruff, yamllint, ansible-lint, mypy
    "molecule:dcgm:default": 58,
    "tests/e2e/test_health_e2e.py": 45,
    "molecule:rdma:default": 39,
    "tests/aws/test_limits.py": 36,
    "tests/aws/test_up.py": 34,
    # Added 2026-12-06 (three workers, ci8: about 1.4 times these): the GPU sharing role's scenario,
    # the team state on moto's S3, nccl-tests' scenario.
    "molecule:gpu_sharing:default": 75,
    "tests/aws/test_team_state.py": 80,  # a local node provisioned by a granted operator
    "tests/e2e/test_recorded_node.py": 32,
    "molecule:nccl_tests:default": 23,
    # End-to-end files that run in seconds in `make test` (their heavy tests opt-in or extended):
    # named so that the e2e default (a new file's 200, to start it early) does not count them as
    # long work before the grown unit (place_grown_unit).
    **dict.fromkeys(("tests/e2e/test_static_onprem.py", "tests/e2e/test_power_local.py",
                     "tests/e2e/test_monitor_e2e.py", "tests/e2e/test_unreachable.py", "tests/e2e/test_pull_e2e.py",
                     "tests/e2e/test_cuda13_e2e.py", "tests/e2e/test_debian13_e2e.py",
                     "tests/e2e/test_registry_fixture.py"), 15),
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
    workers = (getattr(config, "workerinput", None) or {}).get("workercount") or \
        getattr(config.option, "numprocesses", None) or 1
    items[:] = place_grown_unit(items, int(workers) if str(workers).isdigit() else 1)


def place_grown_unit(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """``items`` (in schedule order) with the grown unit's tests moved to where the workers other
    than the from-scratch one will have had about as long as its image takes: started earlier it
    would hold a worker waiting (tests/e2e/scratch_image.py), later it ends the run alone. Units
    that skip whole (extended, opt-in) count for nothing. Without the from-scratch unit in the
    run, or with one worker, the order stays."""
    units = [schedule_unit(item) for item in items]
    if workers < 2 or SCRATCH_UNIT not in units or GROWN_UNIT not in units:
        return items
    grown = [item for item, unit in zip(items, units, strict=True) if unit == GROWN_UNIT]
    rest = [item for item, unit in zip(items, units, strict=True) if unit != GROWN_UNIT]
    runs = {schedule_unit(item) for item in rest if item.get_closest_marker("skip") is None}
    wanted = (workers - 1) * SCRATCH_IMAGE_SHARE * unit_seconds(SCRATCH_UNIT)
    done, seen = 0.0, set()
    for at, item in enumerate(rest):
        unit = schedule_unit(item)
        if unit in seen or unit == SCRATCH_UNIT:
            continue
        if done >= wanted:
            return [*rest[:at], *grown, *rest[at:]]
        seen.add(unit)
        done += unit_seconds(unit) if unit in runs else 0.0
    return [*rest, *grown]


# What each unit took (setup, call and teardown of its tests), printed at the end of the run:
# the figures UNIT_SECONDS wants (benchmarks/schedule.py --seconds reads these lines), and each
# worker's sum, so that a run shows whether its workers ended together.
UNIT_TOOK: dict[str, float] = {}
WORKER_TOOK: dict[str, float] = {}
UNIT_SPAN: dict[str, tuple[float, float, str]] = {}  # unit: (first start, last stop, worker), epoch s
UNIT_OF: dict[str, str] = {}
# CPU-seconds each unit's own processes used on this machine (the pytest worker and every child it
# waited for: ansible-playbook and its forks, molecule, docker's client, moto), from os.times()
# around each phase of each test. The nodes' CPU is their containers' (cgroups), not in these:
# benchmarks/container_cpu.py samples it beside a run.
UNIT_CPU: dict[str, float] = {}
_CPU_MARK: list[float] = []


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _CPU_MARK[:] = [_cpu_now()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    now = _cpu_now()
    spent = now - _CPU_MARK[0] if _CPU_MARK else 0.0
    _CPU_MARK[:] = [now]
    outcome.get_result().user_properties.append(("cpu_s", round(spent, 3)))


def pytest_collection_finish(session: pytest.Session) -> None:
    UNIT_OF.update((item.nodeid, schedule_unit(item)) for item in session.items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _, at, group = report.nodeid.rpartition("@")
    if not at or "]" in group:  # no xdist group suffix (--dist loadgroup adds "@UNIT")
        group = UNIT_OF.get(report.nodeid, report.nodeid.split("::", 1)[0])
    UNIT_TOOK[group] = UNIT_TOOK.get(group, 0.0) + report.duration
    UNIT_CPU[group] = UNIT_CPU.get(group, 0.0) + sum(
        v for k, v in getattr(report, "user_properties", ()) if k == "cpu_s")
    worker = getattr(getattr(report, "node", None), "gateway", None)
    key = getattr(worker, "id", "this process")
    WORKER_TOOK[key] = WORKER_TOOK.get(key, 0.0) + report.duration
    start, stop = getattr(report, "start", None), getattr(report, "stop", None)
    if start is not None and stop is not None:
        was = UNIT_SPAN.get(group)
        UNIT_SPAN[group] = (min(start, was[0]), max(stop, was[1]), key) if was else (start, stop, key)


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.suite_budget import cpu_times

    session.config.stash[_STARTED] = time.monotonic()
    session.config.stash[_CPU] = cpu_times()


_STARTED = pytest.StashKey[float]()
_CPU = pytest.StashKey[dict | None]()


def pytest_terminal_summary(terminalreporter) -> None:
    if not UNIT_TOOK or not any(s >= 30 for s in UNIT_TOOK.values()):
        return
    terminalreporter.section("seconds per unit of work (30 s and more)")
    for unit, took in sorted(UNIT_TOOK.items(), key=lambda kv: -kv[1]):
        if took >= 30:
            terminalreporter.write_line(f"{unit} {took:.0f}")
    for worker, took in sorted(WORKER_TOOK.items()):
        terminalreporter.write_line(f"# {worker}: {took / 60:.1f} min of tests")
    if any(UNIT_CPU.values()):
        terminalreporter.section("CPU-seconds per unit on this side (its processes, not its nodes; 20 and more)")
        for unit, cpu in sorted(UNIT_CPU.items(), key=lambda kv: -kv[1]):
            if cpu >= 20:
                terminalreporter.write_line(f"{unit} {cpu:.0f}")
        terminalreporter.write_line(f"# all units: {sum(UNIT_CPU.values()):.0f} CPU-s")
    from tests.suite_budget import cpu_share, cpu_times, report, speed_probe, timeline

    started = terminalreporter.config.stash.get(_STARTED, None)
    tests_s = time.monotonic() - started if started is not None else None
    busy = cpu_share(terminalreporter.config.stash.get(_CPU, None), cpu_times())
    for line in report(UNIT_TOOK, tests_s, os.environ.get("GPUPROV_SUITE_STARTED"),
                       strategy=SUITE_STRATEGY, speed_s=speed_probe()):
        terminalreporter.write_line(line)
    for line in ([busy] if busy else []) + timeline(UNIT_SPAN):
        terminalreporter.write_line(line)
