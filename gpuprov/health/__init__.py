"""`gpuprov health`: is the hardware well, now? (gpuprov's probes check the software is
installed; these checks read the GPUs, the kernel log and the fabric.)

One script gathers each node's raw readings in one go (gather.py, over the cluster's pinned
SSH or here); the parsers (parse.py, xid.py) and verdicts (checks_*.py) are Python, tested
on recordings of real machines. Levels: quick (seconds per node, fit for a job prolog);
standard and full (DCGM diagnostics, NCCL bandwidth floors) are not built yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpuprov.core.results import HealthCheck
from gpuprov.health import checks_gpu, checks_node, checks_state
from gpuprov.health.facts import Expect, Facts

LEVELS = ("quick", "standard", "full")
BUILT_LEVELS = ("quick",)

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


def evaluate(node: str, facts: Facts, expect: Expect) -> list[HealthCheck]:
    """Every quick check's verdict on one node's readings."""
    return [dataclasses.replace(check(facts, expect), node=node) for check in QUICK]
