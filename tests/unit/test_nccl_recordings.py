"""gpuprov.health.nccl on the real H100 capture (tests/fixtures/recordings/h100-sxm5-580/:
NVIDIA nccl-tests 2.19.6 and an NCCL_DEBUG=INFO all-reduce, run there on 2026-11-23), and
on copies edited in memory, each edit named where it is made."""

from __future__ import annotations

from pathlib import Path

from gpuprov.health import nccl

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "h100-sxm5-580"
GIB = 1 << 30


def _tests() -> str:
    return (H100 / "nccl-tests.txt").read_text()


def test_the_h100_nccl_tests_run_is_read_whole() -> None:
    runs = nccl.parse_tests(_tests())
    assert [r.collective for r in runs] == ["all_reduce_perf", "all_gather_perf"]
    reduce = runs[0]
    assert reduce.version == "2.19.6"
    assert reduce.ranks == [(0, "vm", 0, "0000:00:06", "NVIDIA H100 80GB HBM3")]
    # 8 B to 1 GiB by factor 2: 28 sizes, each read with its eight figures
    assert [r.size for r in reduce.rows] == [1 << n for n in range(3, 31)]
    top = reduce.at(GIB)
    assert (top.count, top.dtype, top.redop, top.time_us, top.algbw, top.busbw, top.wrong) == (
        268435456, "float", "sum", 712.61, 1506.8, 0.0, 0)
    assert top.in_algbw == 4e6  # printed "4e+06"
    # One rank moves nothing over a bus: busbw 0 by definition, whatever the size
    assert {r.busbw for r in reduce.rows} == {0.0} and reduce.avg_busbw == 0.0
    assert reduce.out_of_bounds == 0 and reduce.wrong == 0
    assert reduce.at(3 * GIB) is top and reduce.at(4) is None


def test_wrong_results_and_out_of_bounds_values_are_counted() -> None:
    # Edited: the 1 GiB row's out-of-place #wrong 0 -> 5, and "Out of bounds values : 0 OK"
    # -> "2 FAILED" (a GPU computing garbage, as nccl-tests reports it).
    text = _tests()
    row = next(line for line in text.splitlines() if line.strip().startswith("1073741824"))
    fields = row.split()
    fields[8] = "5"
    text = text.replace(row, "  ".join(fields), 1).replace("# Out of bounds values : 0 OK",
                                                           "# Out of bounds values : 2 FAILED", 1)
    reduce = nccl.parse_tests(text)[0]
    assert reduce.at(GIB).wrong == 5 and reduce.out_of_bounds == 2
    assert reduce.wrong == 1 + 2


def test_mpirun_prefixes_are_read_through() -> None:
    # Edited: every line prefixed the way Open MPI's --tag-output does ("[1,0]<stdout>:").
    tagged = "\n".join(f"[1,0]<stdout>:{line}" for line in _tests().splitlines())
    assert [(r.collective, len(r.rows), r.at(GIB)) for r in nccl.parse_tests(tagged)] == [
        (r.collective, len(r.rows), r.at(GIB)) for r in nccl.parse_tests(_tests())]


def test_the_h100_all_reduce_fell_back_to_sockets() -> None:
    """The real run: no NCCL net plugin, no IB device, so NCCL used TCP sockets (on a host
    with EFA this is the fault the health checks name; on this VM it is all there is)."""
    net = nccl.network((H100 / "nccl-allreduce-1rank.txt").read_text())
    assert net.name == "Socket" and net.sockets and not net.ofi
    assert net.plugin_missing
    assert any("Using network Socket" in line for line in net.evidence)


def test_the_ofi_plugin_is_recognised() -> None:
    # Edited: the capture's network lines as aws-ofi-nccl's plugin names itself
    # ("Libfabric" since NCCL 2.20 with aws-ofi-nccl; "AWS Libfabric" before).
    text = (H100 / "nccl-allreduce-1rank.txt").read_text()
    for name in ("Libfabric", "AWS Libfabric"):
        net = nccl.network(text.replace("network Socket", f"network {name}")
                           .replace("NET plugin Socket", f"NET plugin {name}"))
        assert net.name == name and net.ofi and not net.sockets


def test_nothing_recognisable_is_empty_not_an_error() -> None:
    assert nccl.parse_tests("all_reduce_perf: command not found\n") == []
    assert nccl.network("").name is None
