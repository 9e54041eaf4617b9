"""Driver branch lifecycle and kernel module flavour: the default is the newest long-term
branch not past its end of life that serves the GPUs and the lock's CUDA (computed on the
day given, never a constant), a branch past its end of life resolves only when asked for
and then says so once, the flavour follows the GPU architecture, and the probe helpers
read the flavour a node runs (tests/fixtures/recordings/)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from datetime import date
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.lock import stack
from gpuprov.probes.test_gpu import flavour_of_license, parse_nvrm_version

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
ON = date(2026, 11, 23)


def test_every_pinned_branch_has_a_lifecycle_with_its_source() -> None:
    facts = stack.data()["driver"]
    for branch in facts["branches"]:
        life = stack.lifecycle(branch)
        assert life["kind"] in {"long-term", "production", "feature"}, branch
        year, month = life["eol"].split("-")
        assert len(year) == 4 and 1 <= int(month) <= 12, branch
        assert life["source"], branch
    for branch in ("535", "550", "570", "580"):
        assert stack.lifecycle(branch), branch


def test_default_is_the_newest_supported_long_term_branch_on_the_day() -> None:
    # Today: R580 for every catalog type with a GPU that CUDA 11.8 can drive.
    for itype in catalog.all_types():
        if itype.arch == "sm_100":
            continue
        lock = stack.resolve(itype.name, on=ON)
        assert lock.driver_branch == "580", itype.name
        assert (lock.driver_branch_kind, lock.driver_eol) == ("long-term", "2028-06")
    # Before R535's end of life, and with R580 unknown to the rule (a day before it was
    # long-term is not in the data), the newest long-term branch that serves the GPU wins:
    # R580 already; the rule never falls back to a branch past its end of life.
    assert stack.default_branch(["A100"], "11.8", "nvidia", date(2026, 5, 1)) == "580"
    # After R580's end of life gpuprov pins no supported long-term branch: refused, not R580.
    with pytest.raises(BadInput, match=r"R580 reached its end of life in 2028-06.*--driver"):
        stack.resolve("p4d.24xlarge", on=date(2028, 6, 1))
    # The day is the system clock's unless given.
    assert stack.resolve("p4d.24xlarge").driver_branch == stack.default_branch(
        ["A100"], "11.8", "nvidia", stack.today())


def test_a_branch_past_its_end_of_life_resolves_when_asked_and_says_so() -> None:
    lock = stack.resolve("p4d.24xlarge", driver="535", on=ON).as_dict()
    assert lock["driver"] == lock["fabricmanager"] == "535.309.01"
    line = stack.eol_warning(lock, on=ON)
    assert line is not None and "R535" in line and "end of life in 2026-06" in line
    assert "move to R580 (long-term, until 2028-06)" in line
    # Before its end of life: nothing to say; a supported branch: nothing either.
    assert stack.eol_warning(lock, on=date(2026, 5, 31)) is None
    assert stack.eol_warning(stack.resolve("p4d.24xlarge", on=ON).as_dict(), on=ON) is None
    assert stack.eol_warning(None) is None


def test_distro_source_says_whose_support_applies() -> None:
    lock = stack.resolve("docker-node", source="distro", on=ON)
    assert (lock.driver, lock.kernel_module) == ("535.309.01", "proprietary")
    line = stack.eol_warning(lock.as_dict(), on=ON)
    assert line is not None and "Debian 12 security support" in line and "R535" in line
    assert any("Debian 12 security support" in n for n in lock.notes)


@pytest.mark.parametrize(
    ("itype", "kwargs", "module"),
    [
        ("p3.2xlarge", {}, "proprietary"),  # V100 (Volta): proprietary only
        ("p3dn.24xlarge", {}, "proprietary"),
        ("g4dn.xlarge", {}, "open"),  # T4 (Turing) and newer: open
        ("p4d.24xlarge", {}, "open"),
        ("p5.48xlarge", {}, "open"),
        ("p4d.24xlarge", {"kernel_module": "proprietary"}, "proprietary"),  # both work: override
        ("g5.xlarge", {"source": "distro"}, "proprietary"),  # Debian 12: proprietary only
        ("docker-node", {}, "open"),  # no GPU known: NVIDIA's default for R580
        ("docker-node", {"driver": "535"}, "proprietary"),  # ... and before R560
    ],
)
def test_kernel_module_follows_the_gpu(itype, kwargs, module) -> None:
    lock = stack.resolve(itype, on=ON, **kwargs)
    assert lock.kernel_module == module and lock.public()["kernel_module"] == module
    open_names = all(p.endswith("-open") for p in lock.packages["driver"])
    assert open_names == (module == "open")


def test_flavours_that_cannot_work_are_refused_with_the_reason() -> None:
    b200 = catalog.get("p6-b200.48xlarge")
    # B200 needs CUDA 12.8, which gpuprov's data lacks: the CUDA rule speaks first.
    with pytest.raises(BadInput, match=r"needs CUDA >= 12\.8"):
        stack.resolve_types([b200], on=ON)
    # The flavour rule itself, for a Blackwell GPU and for a V100 beside it.
    with pytest.raises(BadInput, match=r"proprietary kernel modules cannot drive B200.*open"):
        stack._kernel_module("proprietary", ["sm_100"], ["B200"], "580",
                             stack.data()["sources"]["nvidia"], "nvidia")
    with pytest.raises(BadInput, match="no kernel module flavour serves"):
        stack._kernel_module(None, ["sm_100", "sm_70"], ["B200", "V100"], "580",
                             stack.data()["sources"]["nvidia"], "nvidia")
    with pytest.raises(BadInput, match=r"branch 510 predates them"):
        stack._kernel_module("open", ["sm_80"], ["A100"], "510",
                             stack.data()["sources"]["nvidia"], "nvidia")
    # A mixed V100 + A100 cluster: proprietary, the one flavour that drives both.
    mixed = stack.resolve_types([catalog.get("p3.2xlarge"), catalog.get("p4d.24xlarge")], on=ON)
    assert mixed.kernel_module == "proprietary"


def test_public_shape_carries_the_lifecycle() -> None:
    data = stack.resolve("p4d.24xlarge", on=ON).public()
    assert {k: data[k] for k in ("driver_branch", "driver_branch_kind", "driver_eol", "kernel_module")} == {
        "driver_branch": "580", "driver_branch_kind": "long-term", "driver_eol": "2028-06",
        "kernel_module": "open"}
    assert data["fabricmanager"] == data["driver"] == "580.159.04"


def test_locks_stored_before_the_lifecycle_fields_still_load_with_their_hash() -> None:
    lock = stack.resolve("p4d.24xlarge", driver="535", kernel_module="proprietary", on=ON).as_dict()
    # (cuda_archives, os and gpu_sharing came later still: such a lock lacks them too)
    old = {k: v for k, v in lock.items() if k not in ("kernel_module", "driver_branch_kind", "driver_eol",
                                                      "cuda_archives", "os", "gpu_sharing")}
    old["packages"] = {k: v for k, v in old["packages"].items() if k != "pinning"}
    body = {k: v for k, v in old.items() if k not in ("notes", "hash")}
    # The hash as gpuprov computed it before these fields existed.
    old["hash"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    loaded = stack.from_dict(old)
    assert loaded.short_hash() == old["hash"]
    assert loaded.flavour == "proprietary"  # what those locks installed
    public = loaded.public()
    assert (public["driver_branch_kind"], public["driver_eol"], public["kernel_module"]) == (
        "long-term", "2026-06", "proprietary")
    assert stack.eol_warning(asdict(loaded), on=ON) is not None


def test_the_running_flavour_is_read_from_the_recording() -> None:
    real = (RECORDINGS / "h100-sxm5-580" / "proc-driver.txt").read_text()
    assert parse_nvrm_version(real) == {"kernel_module": "open", "driver": "580.159.04"}
    edited = (RECORDINGS / "h100-proprietary-edited" / "proc-driver.txt").read_text()
    assert parse_nvrm_version(edited) == {"kernel_module": "proprietary", "driver": "535.309.01"}
    assert parse_nvrm_version("cat: /proc/driver/nvidia/version: No such file or directory") is None
    assert flavour_of_license("Dual MIT/GPL\n") == "open"
    assert flavour_of_license("NVIDIA") == "proprietary"
    assert flavour_of_license("GPL") is None


def test_the_runtime_probe_judges_the_node_against_the_lock() -> None:
    from gpuprov.probes.conftest import Expectation
    from gpuprov.probes.test_gpu import test_running_kernel_module_flavour_matches_the_lock as probe

    class _Host:
        """FIXTURE: a node's shell answering the probe's one read of /proc/driver/nvidia/version
        (nodefacts.read_text: exit 3 where there is no such file)."""

        def __init__(self, text: str | None) -> None:
            self.text = text

        def run(self, command: str, *args: str) -> SimpleNamespace:
            assert args == ("/proc/driver/nvidia/version",) * 2, (command, args)
            if self.text is None:
                return SimpleNamespace(rc=3, stdout="", stderr="")
            return SimpleNamespace(rc=0, stdout=self.text, stderr="")

    lock = stack.resolve("p5.48xlarge", on=ON).as_dict()
    expect = Expectation(node="n1", instance_type="p5.48xlarge", gpus=1, gpu_model="H100",
                         nvswitch=None, virtualization="vm", stack=lock)
    said: list[str] = []
    real = (RECORDINGS / "h100-sxm5-580" / "proc-driver.txt").read_text()
    probe(_Host(real), expect, said.append)
    assert said == ["open kernel module 580.159.04 loaded"]
    edited = (RECORDINGS / "h100-proprietary-edited" / "proc-driver.txt").read_text()
    with pytest.raises(AssertionError, match=r"expected the open kernel module 580\.159\.04 running, "
                                             r"found the proprietary module 535\.309\.01"):
        probe(_Host(edited), expect, said.append)
    with pytest.raises(AssertionError, match="no NVIDIA module loaded"):
        probe(_Host(None), expect, said.append)


def test_stack_command_shows_the_lifecycle_and_warns_once() -> None:
    from tests.conftest import run_cli

    proc = run_cli("stack", "--type", "p4d.24xlarge", "-o", "json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and not proc.stderr
    assert (data["driver_branch"], data["driver_branch_kind"], data["kernel_module"]) == ("580", "long-term", "open")
    assert data["fabricmanager"] == data["driver"] and data["driver"].startswith("580.")
    old = run_cli("stack", "--type", "p4d.24xlarge", "--driver", "535")
    assert old.returncode == 0 and "535.309.01" in old.stdout
    assert old.stderr.count("reached its end of life in 2026-06") == 1 and "move to R580" in old.stderr
    volta = json.loads(run_cli("stack", "--type", "p3.2xlarge", "-o", "json").stdout)
    assert volta["kernel_module"] == "proprietary"
    b200 = run_cli("stack", "--type", "p6-b200.48xlarge")
    assert b200.returncode == 2 and "needs CUDA >= 12.8" in b200.stderr
    wrong = run_cli("stack", "--type", "p3.2xlarge", "--kernel-module", "open")
    assert wrong.returncode == 2 and "Volta" in wrong.stderr


def test_status_and_verify_warn_for_a_cluster_on_a_branch_past_its_end_of_life(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprov.cli import output as cli_output
    from gpuprov.state import Store

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path))
    Store().create_cluster("old", "static", {}, stack.resolve("p4d.24xlarge", driver="535").as_dict())
    Store().create_cluster("new", "static", {}, stack.resolve("p4d.24xlarge").as_dict())
    cli_output.eol_warning_of("old")
    cli_output.eol_warning_of("new")
    cli_output.eol_warning_of("absent")
    err = capsys.readouterr().err
    assert err.count("gpuprov: warning: driver branch R535") == 1 and err.count("\n") == 1
