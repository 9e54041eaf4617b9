"""The full level: DCGM's diagnostic level 3 on each node (its verdict on the published level 3
and level 4 runs), and the row of the run across nodes (gpuprov.health.cluster_nccl): which
nodes take part or why none can, and the verdict on the published two-node EFA runs of a
p4de.24xlarge and a p5.48xlarge (tests/fixtures/recordings/*-x2-efa), as mpirun returns them,
and on a copy edited in memory to show one fault, named where it is made."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpuprov.health import FULL, cluster_nccl, evaluate, gather, mpi_key
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
def _across(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str, rc: int | None, itype: str,
            left: tuple[str, ...] = ()) -> tuple:
    seen: dict = {}

    def fake_mpi_run(group, files, program, *, ranks_per_node, env=(), timeout=0):
        seen.update(group=group, program=program, ranks=ranks_per_node, env=list(env))
        return cluster_nccl.MpiRun(rc, text, left=left, run_id="gpuprov-mpi-0123456789ab", expires="202611261635Z")

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


def test_a_run_whose_key_could_not_be_removed_everywhere_fails_naming_the_node(monkeypatch, tmp_path) -> None:
    """The published p4de run passes its floor; the key left on c-node-2 turns the row to a
    failure that names the node, why, the run's line and when the key stops working."""
    text = (REC / "p4de-24xlarge-x2-efa" / "all_reduce_perf.txt").read_text()
    row, _ = _across(monkeypatch, tmp_path, text, 0, "p4de.24xlarge", left=("c-node-2: no answer within 60 s",))
    assert row.status == "fail", row
    assert row.found == ("the run's key (gpuprov-mpi-0123456789ab) could not be removed from c-node-2: no answer "
                         "within 60 s; it stops working at 2026-11-26 16:35 UTC, and the next run across nodes "
                         "removes it"), row
    assert "gpuprov-mpi-0123456789ab" in row.action and "authorized_keys" in row.action


# -- a cluster that runs Slurm: the run is one srun step ---------------------------------------------
def _slurm_facts(address: str, name: str) -> Facts:
    return _facts(address=address, slurm_name=Section(name + "\n", 0))


def test_under_slurm_the_run_is_one_srun_step_with_pmix_and_no_key() -> None:
    facts = {"c-node-1": _slurm_facts("10.0.1.5", "ip-10-0-1-5"), "c-node-2": _slurm_facts("10.0.1.6", "ip-10-0-1-6")}
    group, row = cluster_nccl.peers([_node(1), _node(2)], facts, {"c-node-1": P4DE, "c-node-2": P4DE})
    assert row is None
    command = cluster_nccl.srun_command(group, ["sh", "-c", "exec all_reduce_perf -g 1"], ranks_per_node=8,
                                        env=["FI_PROVIDER=efa"], timeout=900)
    assert command == ("timeout 900 srun --job-name=gpuprov-health --nodes=2 --nodelist=ip-10-0-1-5,ip-10-0-1-6 "
                       "--ntasks-per-node=8 --gpus-per-node=8 --mpi=pmix --export=ALL,FI_PROVIDER=efa "
                       "sh -c 'exec all_reduce_perf -g 1' 2>&1")


@pytest.mark.parametrize("name", ["", "a;reboot", "$(id)", "-x"])
def test_a_slurm_name_that_is_not_one_starts_nothing(name: str, tmp_path) -> None:
    facts = {"c-node-1": _slurm_facts("10.0.1.5", "ip-10-0-1-5"), "c-node-2": _slurm_facts("10.0.1.6", name)}
    group, _ = cluster_nccl.peers([_node(1), _node(2)], facts, {"c-node-1": P4DE, "c-node-2": P4DE})
    ran = cluster_nccl.srun_run(group, ClusterFiles(tmp_path), ["true"], ranks_per_node=8)
    assert ran.rc is None and ran.setup == "no Slurm node name read from c-node-2"


def test_the_published_run_as_srun_returns_it_passes_and_makes_no_key(monkeypatch, tmp_path) -> None:
    text = (REC / "p4de-24xlarge-x2-efa" / "all_reduce_perf.txt").read_text()
    seen: dict = {}

    def fake_srun_run(group, files, program, *, ranks_per_node, env=(), timeout=0):
        seen.update(ranks=ranks_per_node, env=list(env))
        return cluster_nccl.MpiRun(0, text)

    def no_mpi_run(*_a, **_k):
        raise AssertionError("mpirun (and its per-run key) on a Slurm cluster")

    # srun itself cannot run here (no GPU, no EFA): what the published nodes printed stands in.
    monkeypatch.setattr(cluster_nccl, "srun_run", fake_srun_run)
    monkeypatch.setattr(cluster_nccl, "mpi_run", no_mpi_run)
    facts = {"c-node-1": _slurm_facts("10.0.1.5", "a"), "c-node-2": _slurm_facts("10.0.1.6", "b")}
    row = cluster_nccl.across_nodes([_node(1), _node(2)], facts, {"c-node-1": P4DE, "c-node-2": P4DE},
                                    ClusterFiles(tmp_path), tmp_path, "srun")
    assert row.status == "pass" and seen == {"ranks": 8, "env": ["FI_PROVIDER=efa"]}, row


# -- the run's key line (gpuprov.health.mpi_key) ----------------------------------------------------
PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFqLpR0wK9m3bYv5x0aD1cU8e2hQ7sT4nJ6oW1rZ3yXk gpuprov-mpi-0123456789ab"
RUN = "gpuprov-mpi-0123456789ab"


def test_the_key_line_is_limited_to_the_launcher_and_expires() -> None:
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "202611261635Z")
    assert line == ('expiry-time="202611261635Z",from="10.0.1.5",restrict ssh-ed25519 '
                    "AAAAC3NzaC1lZDI1NTE5AAAAIFqLpR0wK9m3bYv5x0aD1cU8e2hQ7sT4nJ6oW1rZ3yXk gpuprov-mpi-0123456789ab")
    assert mpi_key.key_line(PUB, RUN, ["10.0.1.5", "10.0.1.6"], "202611261635Z").startswith(
        'expiry-time="202611261635Z",from="10.0.1.5,10.0.1.6",restrict ')


@pytest.mark.parametrize(("public", "run", "sources", "expires"), [
    (PUB, RUN, ["10.0.1.5,0.0.0.0/0"], "202611261635Z"),
    (PUB, RUN, ['10.0.1.5",command="id'], "202611261635Z"),
    (PUB, RUN, ["0.0.0.0"], "202611261635Z"),
    (PUB, RUN, ["10.0.1.5 "], "202611261635Z"),
    (PUB, RUN, [], "202611261635Z"),
    (PUB, "gpuprov-mpi-0123", ["10.0.1.5"], "202611261635Z"),
    (PUB, RUN + "\nssh-ed25519 AAAA x", ["10.0.1.5"], "202611261635Z"),
    (PUB, RUN, ["10.0.1.5"], '202611261635Z",command="id'),
    (PUB, RUN, ["10.0.1.5"], "2026112616Z"),
    ('command="id" ' + PUB, RUN, ["10.0.1.5"], "202611261635Z"),
    ("ssh-rsa AAAAB3NzaC1yc2E x", RUN, ["10.0.1.5"], "202611261635Z"),
    ("ssh-ed25519 AAAA\nssh-ed25519 BBBB", RUN, ["10.0.1.5"], "202611261635Z"),
])
def test_the_key_line_takes_nothing_but_its_parts(public, run, sources, expires) -> None:
    with pytest.raises(ValueError):
        mpi_key.key_line(public, run, sources, expires)


def test_the_key_expires_half_an_hour_after_the_run_starts_in_utc() -> None:
    assert mpi_key.expiry(datetime(2026, 11, 26, 16, 4, 30, tzinfo=UTC)) == "202611261635Z"
    assert mpi_key.expiry(datetime(2026, 12, 31, 23, 59, 0, tzinfo=UTC)) == "202701010030Z"
    assert mpi_key.expiry(datetime(2026, 11, 26, 18, 4, 30, tzinfo=timezone(timedelta(hours=2)))) == "202611261635Z"
    assert mpi_key.shown("202611261635Z") == "2026-11-26 16:35 UTC"


# -- the script that adds and removes it, run here on a home directory of the test's own ------------
OPERATOR = ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorOne op@one",
            # an operator's own line that has the marker and an expiry of its own, past: it is not
            # a gpuprov line unless its comment is the run's id alone
            'expiry-time="202001010000Z" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorTwo gpuprov-mpi-1 op',
            'expiry-time="202001010000Z" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorThree op@three',
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldRun gpuprov-mpi-00000000000a"]  # no expiry: kept
STALE = 'expiry-time="202001010000Z",from="10.0.1.9",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStale gpuprov-mpi-00000000000b'
LIVE = 'expiry-time="209901010000Z",from="10.0.1.9",restrict ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILive gpuprov-mpi-00000000000c'


def _home(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    (tmp_path / ".ssh").mkdir(mode=0o700)
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.write_text(text)
    keys.chmod(mode)
    return keys


def _script(home: Path, mode: str, line: str, *, user: str | None = None) -> subprocess.CompletedProcess[str]:
    """SCRIPT as a node's shell runs it, here: this machine's sh, awk, grep and coreutils."""
    prefix = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user else []
    return subprocess.run([*prefix, "sh", "-c", mpi_key.SCRIPT, "sh", mode, RUN], input=line + "\n", text=True,
                          capture_output=True, env={"HOME": str(home), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"},
                          timeout=30, check=False)


def test_adding_ends_the_last_line_first_and_removes_only_expired_run_lines(tmp_path) -> None:
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    before = "\n".join([OPERATOR[0], STALE, *OPERATOR[1:], LIVE, "ssh-rsa AAAAB3NzaC1yc2E last@line"])  # no final newline
    keys = _home(tmp_path, before, 0o640)
    proc = _script(tmp_path, "add", line)
    assert proc.returncode == 0, proc.stderr
    assert keys.read_text() == "\n".join([OPERATOR[0], *OPERATOR[1:], LIVE, "ssh-rsa AAAAB3NzaC1yc2E last@line",
                                         line]) + "\n"
    assert keys.stat().st_mode & 0o777 == 0o640 and sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]


def test_adding_makes_the_file_when_there_is_none(tmp_path) -> None:
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    proc = _script(tmp_path, "add", line)
    keys = tmp_path / ".ssh" / "authorized_keys"
    assert proc.returncode == 0 and keys.read_text() == line + "\n", proc.stderr
    assert keys.stat().st_mode & 0o777 == 0o600 and keys.parent.stat().st_mode & 0o777 == 0o700


def test_removing_takes_the_run_line_and_expired_ones_and_keeps_every_other_byte(tmp_path) -> None:
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    kept = [OPERATOR[0], *OPERATOR[1:], LIVE, "ssh-rsa AAAAB3NzaC1yc2E last@line"]
    keys = _home(tmp_path, "\n".join([kept[0], line, STALE, *kept[1:], line]) + "\n", 0o644)
    owner = keys.stat().st_uid, keys.stat().st_gid
    proc = _script(tmp_path, "remove", line)
    assert proc.returncode == 0, proc.stderr
    assert keys.read_text() == "\n".join(kept) + "\n"
    assert keys.stat().st_mode & 0o777 == 0o644 and (keys.stat().st_uid, keys.stat().st_gid) == owner
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]  # no temporary file left
    inode = keys.stat().st_ino
    again = _script(tmp_path, "remove", line)  # nothing to remove: the file is not even rewritten
    assert again.returncode == 0 and keys.stat().st_ino == inode and keys.read_text() == "\n".join(kept) + "\n"


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    """A home directory of user nobody's (pytest's own tmp_path is root's alone)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another user (nobody) takes root")
    home = Path(tempfile.mkdtemp(prefix="gpuprov-mpi-key-test-"))
    os.chown(home, NOBODY, NOBODY)
    try:
        yield home
    finally:
        subprocess.run(["chmod", "-R", "u+rwX", str(home)], check=False)
        shutil.rmtree(home)


NOBODY = 65534


def test_removing_rewrites_in_place_where_the_login_cannot_write_its_ssh_directory(nobody_home) -> None:
    """The reason the old cleanup wrote in place, kept as the fallback: the directory is the
    login's but read-only to it (as a user other than root: root writes any directory)."""
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    keys = _home(nobody_home, "\n".join([OPERATOR[0], line, OPERATOR[2]]) + "\n")
    os.chown(keys.parent, NOBODY, NOBODY)
    os.chown(keys, NOBODY, NOBODY)
    keys.parent.chmod(0o500)
    inode = keys.stat().st_ino
    proc = _script(nobody_home, "remove", line, user=str(NOBODY))
    assert proc.returncode == 0, proc.stderr
    assert keys.read_text() == "\n".join([OPERATOR[0], OPERATOR[2]]) + "\n" and keys.stat().st_ino == inode
    assert keys.stat().st_mode & 0o777 == 0o600 and (keys.stat().st_uid, keys.stat().st_gid) == (NOBODY, NOBODY)


def test_a_failed_read_leaves_the_file_as_it_was(nobody_home) -> None:
    """grep's exit above 1 (here: the file cannot be read by the login): nothing is written."""
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    before = "\n".join([OPERATOR[0], line]) + "\n"
    keys = _home(nobody_home, before)
    os.chown(keys.parent, NOBODY, NOBODY)
    keys.chmod(0o000)
    proc = _script(nobody_home, "remove", line, user=str(NOBODY))
    assert proc.returncode == 1 and "could not read" in proc.stderr, proc
    assert keys.read_text() == before and sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]


def test_every_node_cleanup_is_tried_whatever_happens_to_the_others(tmp_path) -> None:
    """remove_everywhere over real commands: one never answers (past its time), one cannot be
    started at all, one does the work: the last is done, the first two named with why."""
    line = mpi_key.key_line(PUB, RUN, ["10.0.1.5"], "209901010000Z")
    keys = _home(tmp_path, "\n".join([OPERATOR[0], line]) + "\n")
    env_sh = ["env", f"HOME={tmp_path}", "sh", "-c", mpi_key.SCRIPT, "sh", "remove", RUN]
    left = mpi_key.remove_everywhere([("n-hangs", ["sleep", "30"]), ("n-broken", [str(tmp_path / "no-such-ssh")]),
                                      ("n-ok", env_sh)], line, timeout=2)
    assert left[0] == "n-hangs: no answer within 2 s" and left[1].startswith("n-broken: FileNotFoundError"), left
    assert len(left) == 2 and keys.read_text() == OPERATOR[0] + "\n"


def test_sigterm_while_the_key_is_out_is_raised_once_and_never_cuts_the_cleanup_short() -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    cleaned = []
    with pytest.raises(mpi_key.Interrupted) as raised, mpi_key.Guard() as guard:
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the signal's handler raises here, at once
                raise AssertionError("SIGTERM was not raised")
            finally:
                guard.disarm()
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # during the cleanup: noted, not raised
            time.sleep(0.1)
            cleaned.append(True)
            raise guard.interrupted([], RUN, "202611261635Z") from None
    assert cleaned == [True] and raised.value.exit_code == 143
    assert str(raised.value) == ("interrupted (SIGTERM) during the run across nodes; the run's key is removed from "
                                 "every node")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
