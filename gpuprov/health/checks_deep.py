"""The standard and full levels' checks on each node: DCGM's diagnostic (level 2; level 3 at
the full level) and NCCL's all_reduce_perf inside the node. Each loads the GPUs for minutes, so
they are not part of the quick level. The
parsers and verdicts are gpuprov.health.dcgm and gpuprov.health.nccl, tested on published
runs of real machines (tests/fixtures/recordings/)."""

from __future__ import annotations

import dataclasses

from gpuprov.health import dcgm, nccl
from gpuprov.health.checks_gpu import failed, no_gpu, skipped
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import DCGM_BUDGET_S, NCCL_BUDGET_S
from gpuprov.results.shapes import HealthCheck

NCCL_CHECK = "nccl_allreduce_node"


def _dcgm(facts: Facts, expect: Expect, level: int) -> HealthCheck:
    expected = f"every test of DCGM's diagnostic level {level} passes (warnings and skips allowed)"
    if expect.nvlink_per_gpu:
        expected += f", {expect.nvlink_per_gpu} NVLink links up per GPU (pcie.gpu_nvlinks_expected_up)"
    if why := no_gpu(facts, expect):
        return skipped(dcgm.CHECK, why, expected)
    return dcgm.diag_check("", facts.text("dcgm_diag"), facts.rc("dcgm_diag"), level=level,
                           expected=f"{expected}, within {DCGM_BUDGET_S[level]} s")


def dcgm_diag(facts: Facts, expect: Expect) -> HealthCheck:
    """The standard level: `dcgmi diag -r 2`."""
    return _dcgm(facts, expect, 2)


def dcgm_diag_long(facts: Facts, expect: Expect) -> HealthCheck:
    """The full level: `dcgmi diag -r 3` (the hardware stress tests)."""
    return _dcgm(facts, expect, 3)


def nccl_in_node(facts: Facts, expect: Expect) -> HealthCheck:
    """all_reduce_perf over the node's GPUs (one process, -g N): no wrong result, and the bus
    bandwidth at or above the type's one-node floor where one is published
    (gpuprov.health.floors: none yet, so the verdict is on wrong results and says so)."""
    if why := no_gpu(facts, expect):
        return skipped(NCCL_CHECK, why, "all_reduce_perf over the node's GPUs: no wrong result")
    text, rc = facts.text("nccl_tests"), facts.rc("nccl_tests")
    if rc == 127:
        return failed(NCCL_CHECK, "all_reduce_perf (NVIDIA nccl-tests) is not installed",
                      "all_reduce_perf on PATH or at /opt/nccl-tests/build",
                      "build NVIDIA nccl-tests against the lock's NCCL (make MPI=1) into /opt/nccl-tests, "
                      "or run --level quick")
    if rc == 124 or rc is None:
        return failed(NCCL_CHECK, f"all_reduce_perf did not finish in {NCCL_BUDGET_S} s",
                      f"a run up to 2 GiB within {NCCL_BUDGET_S} s",
                      "drain the node: a collective that hangs inside one node points at a GPU or NVLink "
                      "fault; run `dcgmi diag -r 3`")
    row = nccl.bandwidth_check("", text, instance_type=expect.instance_type, nodes=1)
    return dataclasses.replace(row, check=NCCL_CHECK)
