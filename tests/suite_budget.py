"""The suite's time against its budget, printed at the end of `make test` (tests/conftest.py).

CI gives a run 90 minutes on a 2-core machine of one of two kinds that look alike: a 2-core AMD EPYC
runs the suite about 1.7 times as slowly as a 2-core Intel Xeon (docs/performance-history.md,
2026-12-02 (2)). `make test` from a fresh clone is held to 45 minutes on the first and 20 on the
second (docs/development.md); a CPU of neither kind gets the slow kind's 45. Going over is said in
the run's last lines, as a message: the budget is a measure of the suite, not a test of the product.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# (what the CPU's model name starts with, the budget in minutes): the machine kinds CI runs on.
BUDGETS = (("AMD EPYC", 45), ("Intel(R) Xeon", 20))
DEFAULT_BUDGET = 45
# How much longer the AMD kind takes the same suite than the Intel kind (measured this month:
# 57.7 min against 32.3 to 33.4 on CI's Intel machines): a run on one kind is scaled by it to say
# what the other would take, against the other's budget. An estimate only: on 2026-12-07 a new AMD
# EPYC ran the suite in 33.1 min in all against the Intel kind's 29.7 the day before
# (docs/performance-history.md, 2026-12-07 (6)), so the line says it is not that kind's own run.
AMD_OVER_INTEL = 1.7
# No unit of work may be longer than this share of its kind's budget: past it, that one unit
# sets the floor of the whole run and a worker idles behind it.
MAX_UNIT_SHARE = 0.25


# A fixed piece of pure-Python work, timed on one core at the end of the run: machines of one kind
# differ (two 2-core AMD EPYCs ran the same units 1.7 to 1.9 times apart, docs/performance-history.md,
# 2026-12-02), and this figure tells a slow machine from a slow suite when two runs are compared.
SPEED_LOOP = 5_000_000


def speed_probe(n: int = SPEED_LOOP) -> float:
    """Seconds this machine takes to add up ``n`` integers in a Python loop."""
    started, total = time.perf_counter(), 0
    for i in range(n):
        total += i
    return time.perf_counter() - started


def cpu_times(stat: Path = Path("/proc/stat")) -> dict[str, int] | None:
    """The machine's CPU time so far, in clock ticks of all its cores together: user (nice
    included), system (irq and softirq included), idle and iowait; None where /proc/stat is not."""
    try:
        fields = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "cpu" or len(fields) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq = (int(v) for v in fields[1:8])
    return {"user": user + nice, "system": system + irq + softirq, "idle": idle, "iowait": iowait}


def cpu_share(before: dict[str, int] | None, after: dict[str, int] | None) -> str | None:
    """How the machine's cores spent the time between two ``cpu_times``, in per cent: a run whose
    cores stood idle has room for another worker; one busy throughout, only for less work."""
    if not before or not after:
        return None
    spent = {k: after[k] - before[k] for k in before}
    total = sum(spent.values())
    if total <= 0:
        return None
    pct = {k: 100 * v / total for k, v in spent.items()}
    return (f"  the machine's cores over the tests: user {pct['user']:.0f} %, system {pct['system']:.0f} %, "
            f"idle {pct['idle']:.0f} %, waiting for I/O {pct['iowait']:.0f} %")


def timeline(spans: dict[str, tuple[float, float, str]], at_least_s: float = 30) -> list[str]:
    """Each unit of ``at_least_s`` and more: its worker and when it ran, in seconds from the first
    test's start, in the order they started (what ran beside what; where a worker waited)."""
    if not spans:
        return []
    zero = min(start for start, _, _ in spans.values())
    lines = ["  when each unit ran (s from the first test; worker):"]
    for unit, (start, stop, worker) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        if stop - start >= at_least_s:
            lines.append(f"    {start - zero:6.0f} .. {stop - zero:6.0f}  {worker:>4}  {unit}")
    return lines


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first CPU's model name, as lscpu prints it ('unknown' where the file does not say)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return "unknown"


def budget_minutes(model: str) -> tuple[int, str]:
    """The budget for a CPU of ``model`` and the kind it was chosen by."""
    for prefix, minutes in BUDGETS:
        if model.startswith(prefix):
            return minutes, prefix
    return DEFAULT_BUDGET, "a CPU of neither kind: the slow kind's"


def report(units: dict[str, float], tests_s: float | None, started_epoch: str | None,
           *, model: str | None = None, cores: int | None = None, now: float | None = None,
           strategy: str | None = None, speed_s: float | None = None) -> list[str]:
    """The closing lines: the machine (and its speed at a fixed loop), the e2e units' Ansible
    strategy, the wall time (the whole `make test` when its start is known,
    GPUPROV_SUITE_STARTED, else the tests), the ten slowest units, and the budget."""
    model = model or cpu_model()
    cores = cores or len(os.sched_getaffinity(0))
    minutes, kind = budget_minutes(model)
    lines = ["", f"the suite's time (tests/suite_budget.py): {model}, {cores} cores"]
    if speed_s is not None:
        lines.append(f"  this machine's speed: {SPEED_LOOP / 1e6:.0f} M additions in a Python loop in "
                     f"{speed_s:.2f} s (one core, at the end of the run)")
    if strategy:
        lines.append(f"  the e2e units' Ansible strategy: {strategy} (the node from scratch: linear)")
    wall_s = None
    if started_epoch and started_epoch.isdigit():
        wall_s = (now if now is not None else time.time()) - int(started_epoch)
    if tests_s is not None:
        lines.append(f"  tests: {tests_s / 60:.1f} min of wall time")
    if wall_s is not None:
        lines.append(f"  make test in all (set-up and lint included): {wall_s / 60:.1f} min")
    lines.append("  the ten slowest units (seconds of one worker):")
    for unit, took in sorted(units.items(), key=lambda kv: -kv[1])[:10]:
        lines.append(f"    {took:7.0f}  {unit}")
    cap = minutes * 60 * MAX_UNIT_SHARE
    for unit, took in sorted(units.items(), key=lambda kv: -kv[1]):
        if took > cap:
            lines.append(f"  LONG UNIT: {unit} took {took:.0f} s, more than a quarter of the budget "
                         f"({cap:.0f} s): split it or cut its work")
    spent = wall_s if wall_s is not None else tests_s
    if spent is None:
        return lines
    other = _the_other_kind(model, spent)
    if other:
        lines.append(other)
    if spent > minutes * 60:
        lines.append(f"  OVER BUDGET: {spent / 60:.1f} min against {minutes} on this machine ({kind}); "
                     "docs/development.md says where each unit's time goes and what to move")
    else:
        lines.append(f"  within budget: {spent / 60:.1f} min of {minutes} on this machine ({kind})")
    return lines


def _the_other_kind(model: str, spent_s: float) -> str | None:
    """What the run would take on CI's other kind of machine, at the measured ratio."""
    if model.startswith(BUDGETS[0][0]):
        scaled, (kind, minutes) = spent_s / AMD_OVER_INTEL, BUDGETS[1]
    elif model.startswith(BUDGETS[1][0]):
        scaled, (kind, minutes) = spent_s * AMD_OVER_INTEL, BUDGETS[0]
    else:
        return None
    return (f"  on the other kind ({kind}), at {AMD_OVER_INTEL} times (an estimate, not a run there): about "
            f"{scaled / 60:.1f} min of its {minutes}")
