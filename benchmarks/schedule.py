"""What `make test`'s two workers would do: pytest-xdist's schedule, simulated (not a test).

Collects the suite (no test runs), puts each test in its unit of work the way tests/conftest.py
does, gives each unit its seconds (tests/conftest.py UNIT_SECONDS, or a figure of your own
from a --durations report: --seconds FILE, lines "UNIT SECONDS"), and plays xdist's
LoadScopeScheduling (3.8) through: the first unit of the queue to each worker, then another
unit to a worker whenever it has at most two tests left. Prints each worker's units and sum
and the end of the run, for the schedule `make test` runs (--dist loadgroup, units longest
first) and for the one before it (--dist loadfile, files ordered by their number of tests,
the molecule scenarios in two files of every other scenario).

    python benchmarks/schedule.py [--seconds FILE] [--add UNIT=SECONDS ...]

The figures are a model: a unit's seconds are spread evenly over its tests, and two units
running at once are taken to cost what each costs when the suite runs (the figures are
measured so).
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import sys
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# What a unit cost before this schedule's cuts that it does not now (seconds): the faults'
# own cluster (its set-up, which test_docker_cluster.py's cluster served before) and the two
# driver plays of dcgm's scenario (its idempotence and check steps ran the driver play too).
BEFORE_LESS = {"tests/e2e/test_cluster_faults.py": 168}
BEFORE_MORE = {"molecule:dcgm:default": 75}


def collect() -> list[tuple[str, str]]:
    """(node id, unit) of every test, in the order tests/conftest.py leaves them."""
    import pytest

    from tests.conftest import schedule_unit

    class Catch:
        def __init__(self) -> None:
            self.items: list[tuple[str, str]] = []

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
            self.items[:] = [(i.nodeid, schedule_unit(i)) for i in items]

    catch = Catch()
    with contextlib.redirect_stdout(io.StringIO()):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], plugins=[catch])
    if code not in (0, 5):
        raise SystemExit(f"collection failed ({code})")
    return catch.items


def simulate(units: OrderedDict[str, list[float]], workers: int = 2) -> list[tuple[float, list[str]]]:
    """xdist's LoadScopeScheduling over ``units`` (in queue order; each a list of test
    seconds): per worker, its end and its units."""
    queue = list(units.items())
    pending: list[list[float]] = [[] for _ in range(workers)]
    took: list[list[str]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def assign(w: int) -> None:
        unit, tests = queue.pop(0)
        took[w].append(unit)
        pending[w].extend(tests)

    for w in range(workers):
        if queue:
            assign(w)
    for w in range(workers):
        if queue and len(pending[w]) <= 2:
            assign(w)
    events = [(clock[w] + pending[w][0], w) for w in range(workers) if pending[w]]
    heapq.heapify(events)
    while events:
        now, w = heapq.heappop(events)
        clock[w] = now
        pending[w].pop(0)
        if queue and len(pending[w]) <= 2:
            assign(w)
        if pending[w]:
            heapq.heappush(events, (now + pending[w][0], w))
    return [(clock[w], took[w]) for w in range(workers)]


def spread(unit_tests: OrderedDict[str, list[str]], seconds) -> OrderedDict[str, list[float]]:
    return OrderedDict((u, [seconds(u) / len(ts)] * len(ts)) for u, ts in unit_tests.items())


def report(title: str, runs: list[tuple[float, list[str]]], seconds) -> None:
    print(f"\n{title}: ends at {max(end for end, _ in runs) / 60:.1f} min")
    for w, (end, units) in enumerate(runs):
        heavy = [f"{u} {seconds(u):.0f}" for u in units if seconds(u) >= 100]
        print(f"  worker {w}: {end / 60:.1f} min, {len(units)} units; of them >= 100 s: {', '.join(heavy)}")


def main() -> None:
    from tests.conftest import unit_seconds
    from tests.molecule.scenarios import SCENARIOS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=Path, help='lines "UNIT SECONDS" (they win over the table)')
    parser.add_argument("--add", action="append", default=[], metavar="UNIT=SECONDS",
                        help="a unit that is not in the suite yet (e.g. molecule:slurm:default=240)")
    args = parser.parse_args()
    own: dict[str, float] = {}
    if args.seconds:
        for line in args.seconds.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                unit, value = line.rsplit(None, 1)
                own[unit] = float(value)
    extra = dict(a.rsplit("=", 1) for a in args.add)

    def seconds(unit: str) -> float:
        return own.get(unit, unit_seconds(unit))

    items = collect()
    items += [(f"{u}::added", u) for u in extra]
    own |= {u: float(s) for u, s in extra.items()}

    now: OrderedDict[str, list[str]] = OrderedDict()
    for nodeid, unit in items:
        now.setdefault(unit, []).append(nodeid)
    report("now: --dist loadgroup, longest first", simulate(spread(now, seconds)), seconds)

    # Before: one unit per file, the molecule scenarios in two files (every other one), the
    # files ordered by their number of tests (xdist's loadscope reorder), collection order
    # otherwise.
    # test_cluster_faults.py's tests were test_docker_cluster.py's, on its cluster (without
    # the set-up of a cluster of their own); dcgm's scenario ran the driver play three times.
    halves = {f"molecule:{r}:{s}": i % 2 for i, (r, s) in enumerate(SCENARIOS)}
    files = ("tests/molecule/test_scenarios.py", "tests/molecule/test_scenarios_second_half.py")
    moved = {"tests/e2e/test_cluster_faults.py": "tests/e2e/test_docker_cluster.py"}
    before_tests: OrderedDict[str, list[float]] = OrderedDict()
    for nodeid, unit in sorted(items, key=lambda i: moved.get(i[0].split("::")[0], i[0].split("::")[0])):
        file = files[halves[unit]] if unit in halves else moved.get(unit, nodeid.split("::")[0])
        share = (seconds(unit) - BEFORE_LESS.get(unit, 0) + BEFORE_MORE.get(unit, 0)) / sum(
            1 for _, u in items if u == unit)
        before_tests.setdefault(file, []).append(share)
    ordered = OrderedDict(sorted(before_tests.items(), key=lambda kv: -len(kv[1])))
    report("before: --dist loadfile, files by number of tests",
           simulate(ordered), lambda f: sum(before_tests[f]))


if __name__ == "__main__":
    main()
