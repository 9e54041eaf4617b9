"""The full level: DCGM's diagnostic level 3 on each node (its verdict on the published level 3
and level 4 runs), and the row of the run across nodes (gpuprov.health.cluster_nccl): which
nodes take part or why none can, and the verdict on the published two-node EFA runs of a
p4de.24xlarge and a p5.48xlarge (tests/fixtures/recordings/*-x2-efa), as mpirun returns them,
and on a copy edited in memory to show one fault, named where it is made."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuprov.health import FULL, cluster_nccl, evaluate, gather
from gpuprov.health.checks_deep import dcgm_diag_long
from gpuprov.health.facts import Expect, Facts
from gpuprov.health.gather import Section, recorded
from gpuprov.providers import ClusterFiles
from gpuprov.state import NodeRecord

REC = Path(__file__).parents[1] / "fixtures" / "recordings"
GPU_PCI = "\n".join(f"/sys/bus/pci/devices/0000:{10 + i}:00.0 vendor=0x10de device=0x20b0 class=0x030200"
                    for i in range(8))


def _facts(pci: str = GPU_PCI, address: str = "10.0.1.5", mpirun_rc: int = 0, **more: Section) -> Facts:
    return Facts({"pci": Section(pci, 0), "cluster_address": Section(address, 0),
                  "mpirun": Section("/usr/bin/mpirun", mpirun_rc), **more})


def _node(i: int) -> NodeRecord:
    return NodeRecord(name=f"c-node-{i}", id=f"i-{i}", address=f"203.0.113.{i}", ssh_port=22, user="gpuprov",
                      state="running", instance_type="p4de.24xlarge")


P4DE = Expect(instance_type="p4de.24xlarge", gpus=8, efa_interfaces=4)


# -- the script ------------------------------------------------------------------------------------
def test_the_full_script_runs_dcgm_level_3_with_its_budget_and_reads_what_mpirun_needs() -> None:
    full, standard = gather.script("full", 12), gather.script("standard", 12)
    assert "timeout 1800 dcgmi diag -r 3 -p pcie.gpu_nvlinks_expected_up=12 2>&1" in full
    assert "timeout 600 dcgmi diag -r 2 -p pcie.gpu_nvlinks_expected_up=12 2>&1" in standard
    assert "cluster_address" in full and "cluster_address" not in standard and "mpirun" not in standard
    assert gather.BUDGET_S["full"] > gather.DCGM_BUDGET_S[3] + gather.NCCL_BUDGET_S


def test_the_full_script_runs_here() -> None:
    proc = subprocess.run(["sh", "-s"], input=gather.script("full"), capture_output=True, text=True,
                          timeout=120, check=False)
    found = gather.split(proc.stdout)
    assert list(found) == [*gather.COMMANDS, *gather.STANDARD, *gather.FULL]
    rows = evaluate("here", Facts(found), Expect(), "full")
    assert len(rows) == len(FULL) and rows[-2].check == "dcgm_diag"
    address = found["cluster_address"].text.strip()
    assert address.count(".") == 3, address  # this machine's own address on its default route


# -- DCGM level 3 ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "status", "found"), [
    # g5.12xlarge, DCGM 3.3.9, `dcgmi diag -r 3`: Targeted Power fails on GPU 1 (published).
    ("g5-12xlarge-diag-r3-targeted-power-fail.txt", "fail", "Targeted Power failed"),
    # DCGM 2, a level 4 run (level 3's tests and more), every test passing (published).
    ("dcgm2-diag-r4.txt", "pass", "none failed"),
])
def test_dcgm_level_3_verdicts_on_published_runs(name: str, status: str, found: str) -> None:
    text = recorded((REC / "dcgm-published" / name).read_text())
    row = dcgm_diag_long(_facts(dcgm_diag=Section(text, 0 if status == "pass" else 226)), Expect(gpus=4))
    assert row.status == status and found in row.found, row
    assert row.found.startswith("dcgmi diag -r 3") and "level 3" in row.expected and "1800 s" in row.expected


def test_dcgm_level_3_past_its_budget_fails_saying_so() -> None:
    row = dcgm_diag_long(_facts(dcgm_diag=Section("", 124)), Expect(gpus=8))
    assert row.status == "fail" and "-r 3 did not finish" in row.found


# -- who takes part in the run across nodes --------------------------------------------------------
def test_one_node_has_nothing_to_run_across() -> None:
    row = cluster_nccl.one_node()
    assert (row.node, row.check, row.status) == ("cluster", "nccl_allreduce_cluster", "skip")
    assert "one node" in row.reason


def test_nodes_without_gpus_skip_with_the_node_named() -> None:
    nodes = [_node(1), _node(2)]
    facts = {"c-node-1": _facts(), "c-node-2": _facts(pci="")}
    group, row = cluster_nccl.peers(nodes, facts, {"c-node-1": P4DE, "c-node-2": Expect(gpus=0)})
    assert not group and row.status == "skip" and row.reason == "c-node-2: no NVIDIA GPU on the PCI bus"


@pytest.mark.parametrize(("change", "found"), [
    ({"address": "10.0.1.5; reboot"}, "c-node-2: no address on its default route"),
    ({"address": ""}, "c-node-2: no address on its default route"),
    ({"mpirun_rc": 127}, "c-node-2: mpirun is not installed"),
    ({"pci": "\n".join(GPU_PCI.splitlines()[:7])}, "GPU counts differ: c-node-1 8, c-node-2 7"),
])
def test_a_run_that_should_be_and_cannot_fails_naming_why(change: dict, found: str) -> None:
    nodes = [_node(1), _node(2)]
    facts = {"c-node-1": _facts(), "c-node-2": _facts(**change)}
    group, row = cluster_nccl.peers(nodes, facts, {"c-node-1": P4DE, "c-node-2": P4DE})
    assert not group and row.status == "fail" and row.found.startswith(found), row


def test_every_gpu_of_every_node_takes_part() -> None:
    nodes = [_node(1), _node(2)]
    facts = {"c-node-1": _facts(address="10.0.1.5"), "c-node-2": _facts(address="10.0.1.6")}
    group, row = cluster_nccl.peers(nodes, facts, {"c-node-1": P4DE, "c-node-2": P4DE})
    assert row is None and [(p.address, p.gpus) for p in group] == [("10.0.1.5", 8), ("10.0.1.6", 8)]


# -- the verdict on what mpirun returned -----------------------------------------------------------
def _across(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, rc: int | None, itype: str) -> tuple:
    seen: dict = {}

    def fake_mpi_run(group, files, program, *, ranks_per_node, env=(), timeout=0):
        seen.update(group=group, program=program, ranks=ranks_per_node, env=list(env))
        return rc, text

    # mpirun itself cannot run here (no GPU, no EFA): what it printed on the published nodes stands in.
    monkeypatch.setattr(cluster_nccl, "mpi_run", fake_mpi_run)
    nodes = [_node(1), _node(2)]
    facts = {"c-node-1": _facts(address="10.0.1.5"), "c-node-2": _facts(address="10.0.1.6")}
    expect = Expect(instance_type=itype, gpus=8, efa_interfaces=4 if itype.startswith("p4") else 32)
    row = cluster_nccl.across_nodes(nodes, facts, {"c-node-1": expect, "c-node-2": expect},
                                    ClusterFiles(tmp_path), tmp_path)
    return row, seen


@pytest.mark.parametrize(("folder", "itype"), [("p4de-24xlarge-x2-efa", "p4de.24xlarge"),
                                               ("p5-48xlarge-x2-efa", "p5.48xlarge")])
def test_the_published_two_node_runs_pass_their_floor(monkeypatch, tmp_path, folder: str, itype: str) -> None:
    text = (REC / folder / "all_reduce_perf.txt").read_text()
    row, seen = _across(monkeypatch, tmp_path, text, 0, itype)
    assert (row.node, row.check, row.status) == ("cluster", "nccl_allreduce_cluster", "pass"), row
    assert "over 2 node(s)" in row.expected
    assert seen["ranks"] == 8 and seen["env"] == ["FI_PROVIDER=efa"]
    assert (tmp_path / "nccl-across-nodes.txt").read_text() == text


def test_a_run_below_the_floor_fails(monkeypatch, tmp_path) -> None:
    text = (REC / "p4de-24xlarge-x2-efa" / "all_reduce_perf.txt").read_text()
    # Edited: the 2 GiB row's busbw (78.33 both ways, published) set to 12.50, what one node's
    # traffic over TCP sockets instead of EFA could reach.
    edited = "\n".join(line.replace("78.33", "12.50") if " 2147483648 " in line else line
                       for line in text.splitlines())
    assert edited != text
    row, _ = _across(monkeypatch, tmp_path, edited, 0, "p4de.24xlarge")
    assert row.status == "fail" and "12.5" in row.found, row


def test_a_run_past_its_budget_fails_saying_so(monkeypatch, tmp_path) -> None:
    row, _ = _across(monkeypatch, tmp_path, "", None, "p4de.24xlarge")
    assert row.status == "fail" and "did not finish in 900 s" in row.found
