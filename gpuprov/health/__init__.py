"""`gpuprov health`: is the hardware well, now? (gpuprov's probes check the software is
installed; these checks read the GPUs, the kernel log and the fabric.)

One script gathers each node's raw readings in one go (gather.py, over the cluster's pinned
SSH or here); the parsers (parse.py, xid.py) and verdicts (checks_*.py) are Python, tested
on recordings of real machines. Levels: quick (seconds per node, fit for a job prolog);
standard (minutes: DCGM's diagnostic level 2 and NCCL's all_reduce_perf inside each node);
full (DCGM's level 3 on each node, then all_reduce_perf across all the nodes: cluster_nccl.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpuprov.health import checks_deep, checks_gpu, checks_node, checks_state
from gpuprov.health.facts import Expect, Facts
from gpuprov.results.shapes import HealthCheck

LEVELS = ("quick", "standard", "full")
BUILT_LEVELS = LEVELS

Check = Callable[[Facts, Expect], HealthCheck]

# The quick level, in the order a person reads a node's state.
QUICK: tuple[Check, ...] = (
    checks_gpu.gpu_count,
    checks_gpu.gpu_answers,
    checks_gpu.driver,
    checks_gpu.fabricmanager,
    checks_gpu.nvlink,
    checks_state.ecc,
    checks_state.row_remap,
    checks_node.xids,
    checks_state.clocks,
    checks_state.temperature,
    checks_node.efa,
    checks_node.memlock,
    checks_node.peermem,
)


# The standard level: the quick level's checks, then these (their sections are read only at
# this level: gather.STANDARD).
STANDARD: tuple[Check, ...] = (
    *QUICK,
    checks_deep.dcgm_diag,
    checks_deep.nccl_in_node,
)


# The full level on each node: DCGM's level 3 instead of 2 (the run across the nodes is one
# more row, for the cluster: gpuprov.health.cluster_nccl).
FULL: tuple[Check, ...] = (
    *QUICK,
    checks_deep.dcgm_diag_long,
    checks_deep.nccl_in_node,
)


def evaluate(node: str, facts: Facts, expect: Expect, level: str = "quick") -> list[HealthCheck]:
    """Every check's verdict of ``level`` on one node's readings. A check that cannot read
    what the node gave (a tool's output in a shape its parser has not seen) fails alone,
    naming its error: the node's other checks still give their verdicts."""
    checks = {"standard": STANDARD, "full": FULL}.get(level, QUICK)
    return [dataclasses.replace(_guarded(check, facts, expect), node=node) for check in checks]


def _guarded(check: Check, facts: Facts, expect: Expect) -> HealthCheck:
    try:
        return check(facts, expect)
    except Exception as exc:  # noqa: BLE001 - one unreadable reading must not hide the others
        detail = f"{type(exc).__name__}: {exc}"[:300].replace("\n", " ")
        return HealthCheck(node="", check=check.__name__, status="fail",
                           found=f"its readings could not be read ({detail})", expected="readings it can judge",
                           action="run `gpuprov health --local` on the node and report its output with "
                                  "gpuprov's version: the check's parser does not know this shape")
