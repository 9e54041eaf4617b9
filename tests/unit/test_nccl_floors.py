"""NCCL bus-bandwidth floors (gpuprov.health.floors) and their verdict
(gpuprov.health.nccl.bandwidth_check), on the published two-node EFA runs recorded in
tests/fixtures/recordings/p4de-24xlarge-x2-efa and p5-48xlarge-x2-efa (srun-labelled
all_reduce_perf tables, verbatim), and on copies edited in memory, each edit named where it
is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.health import floors, nccl

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
GIB = 1 << 30


def _table(folder: str) -> str:
    return (REC / folder / "all_reduce_perf.txt").read_text()


def _edit(text: str, size: int, out_busbw: str, in_busbw: str) -> str:
    """The row of ``size`` with both busbw figures replaced (its other figures kept)."""
    lines = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 14 and fields[1] == str(size):
            fields[8], fields[12] = out_busbw, in_busbw
            line = " ".join(fields)
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_published_tables_are_read_through_srun_labels() -> None:
    (p4de,) = nccl.parse_tests(_table("p4de-24xlarge-x2-efa"))
    assert [r.size for r in p4de.rows] == [1 << n for n in range(3, 32)]
    assert (p4de.at(2 * GIB).busbw, p4de.at(2 * GIB).in_busbw) == (78.33, 78.33) and p4de.wrong == 0
    (p5,) = nccl.parse_tests(_table("p5-48xlarge-x2-efa"))
    assert p5.rows[-1].size == 16 * GIB and p5.rows[-1].busbw == 487.09
    assert (p5.at(2 * GIB).busbw, p5.at(2 * GIB).in_busbw) == (443.72, 442.06)


@pytest.mark.parametrize(("folder", "itype", "floor"), [
    ("p4de-24xlarge-x2-efa", "p4de.24xlarge", 62.0),
    ("p4de-24xlarge-x2-efa", "p4d.24xlarge", 62.0),
    ("p5-48xlarge-x2-efa", "p5.48xlarge", 355.0),
])
def test_healthy_published_runs_pass_their_floor(folder: str, itype: str, floor: float) -> None:
    check = nccl.bandwidth_check("n1", _table(folder), instance_type=itype, nodes=2)
    assert check.status == "pass" and check.check == "nccl_allreduce", check
    assert f">= {floor} GB/s at {2 * GIB} B over 2 node(s)" in check.expected
    assert "awesome" not in check.expected and "awsome-distributed-training" in check.expected
    # the same floor holds for larger runs of the type (busbw does not depend on the rank count)
    assert floors.floor_for(itype, 8) == floors.floor_for(itype, 2)


def test_each_floor_is_its_published_figure_less_a_fifth() -> None:
    for floor in floors.FLOORS:
        assert floor.margin == pytest.approx(0.2, abs=0.01), floor
        assert floor.published in {78.33, 443.72}


def test_a_run_below_the_floor_fails_naming_what_to_check() -> None:
    # Edited: the 2 GiB row of the p5 run, busbw 443.72/442.06 -> 98.40/98.10 (a pair of nodes
    # whose inter-node traffic runs over a fraction of its links).
    slow = _edit(_table("p5-48xlarge-x2-efa"), 2 * GIB, "98.40", "98.10")
    check = nccl.bandwidth_check("p5-node-2", slow, instance_type="p5.48xlarge", nodes=2)
    assert check.status == "fail" and check.node == "p5-node-2"
    assert check.found == f"busbw 98.4 GB/s out of place, 98.1 in place at {2 * GIB} B"
    assert "NET/OFI, not Socket" in check.action and "efa" in check.action
    # Edited: only the in-place figure of the p4de 2 GiB row, 78.33 -> 40.12: the lower one counts.
    half = _edit(_table("p4de-24xlarge-x2-efa"), 2 * GIB, "78.33", "40.12")
    assert nccl.bandwidth_check("n", half, instance_type="p4d.24xlarge", nodes=2).status == "fail"


def test_wrong_results_fail_whatever_the_bandwidth() -> None:
    # Edited: the 1 GiB row of the p4de run, out-of-place #wrong 0 -> 3.
    lines = []
    for line in _table("p4de-24xlarge-x2-efa").splitlines():
        fields = line.split()
        if len(fields) == 14 and fields[1] == str(GIB):
            fields[9] = "3"
            line = " ".join(fields)
        lines.append(line)
    check = nccl.bandwidth_check("n", "\n".join(lines), instance_type="p4de.24xlarge", nodes=2)
    assert check.status == "fail" and check.found.startswith("1 wrong result"), check
    assert "dcgmi diag -r 3" in check.action


def test_no_floor_no_table_and_a_short_run() -> None:
    text = _table("p4de-24xlarge-x2-efa")
    # g5 has no published two-node result: wrong results only, said so
    check = nccl.bandwidth_check("n", text, instance_type="g5.48xlarge", nodes=2)
    assert check.status == "pass" and "no published floor for g5.48xlarge over 2 node(s)" in check.expected
    # one node of p4d: the floors here are for EFA runs of two nodes or more
    assert floors.floor_for("p4d.24xlarge", 1) is None
    assert nccl.bandwidth_check("n", "NCCL error\n", instance_type="p4d.24xlarge", nodes=2).status == "fail"
    # Edited: the run cut after 1 GiB (the 2 GiB row removed): the floor's size was not reached.
    short = "\n".join(line for line in text.splitlines() if str(2 * GIB) not in line)
    check = nccl.bandwidth_check("n", short, instance_type="p4d.24xlarge", nodes=2)
    assert check.status == "fail" and check.found == f"the run stopped at {GIB} B"
