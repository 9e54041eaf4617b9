"""The patch logic that needs no node: validation, the new lock, plans, batches, the
health gate's comparison, the playbook's report, the microcode revision reader."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import struct
from pathlib import Path

import pytest

from gpuprov.core import patch
from gpuprov.errors import BadInput
from gpuprov.lock import stack
from tests.conftest import ROOT, run_cli


def test_nothing_to_patch_is_bad_input() -> None:
    with pytest.raises(BadInput, match="nothing to patch"):
        patch.request()


def test_batch_below_one_is_bad_input() -> None:
    with pytest.raises(BadInput, match="--batch must be at least 1"):
        patch.request(kernel=True, batch=0)


def test_empty_hook_is_bad_input() -> None:
    with pytest.raises(BadInput, match="--drain is empty"):
        patch.request(kernel=True, drain="  ")


def test_all_moves_everything() -> None:
    req = patch.request(all_=True)
    assert req.move_driver and req.kernel and req.microcode and req.driver is None


def test_cli_refuses_bad_input_with_exit_2(gpuprov_home) -> None:
    proc = run_cli("patch", "nosuch", "--kernel")
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "gpuprov: unknown cluster 'nosuch'; `gpuprov list` shows the clusters"
    proc = run_cli("patch", "nosuch")
    assert proc.returncode == 2 and "nothing to patch" in proc.stderr


def test_new_lock_moves_fabric_manager_with_the_driver() -> None:
    old = stack.resolve("p4d.24xlarge", driver="525", source="nvidia").as_dict()
    new = patch.new_lock(old, patch.request(driver="535"))
    assert new["driver"] == new["fabricmanager"] == stack.data()["driver"]["branches"]["535"]
    assert new["packages"]["fabricmanager_version"] == f"{new['driver']}-*"
    assert new["cuda"] == old["cuda"] and new["hash"] != old["hash"]


def test_new_lock_is_checked_by_the_resolver() -> None:
    old = stack.resolve("p5.48xlarge", source="nvidia").as_dict()
    with pytest.raises(BadInput, match=r"too old for CUDA 11\.8"):
        patch.new_lock(old, patch.request(driver="515"))


def test_new_lock_without_driver_keeps_the_driver_and_adds_microcode_pins() -> None:
    old = stack.resolve(None, source="mirror").as_dict()
    old.update(driver="535.288.01")
    old.pop("microcode")
    new = patch.new_lock(old, patch.request(microcode=True))
    assert new["driver"] == "535.288.01"
    assert new["microcode"] == stack.data()["microcode"]


def test_plan_lists_what_would_move() -> None:
    lock = stack.resolve(None, source="mirror", driver="535", kernel_module="proprietary").as_dict()
    report = {"before": {"nvidia-driver-535": "535.288.01-1", "nvidia-dkms-535": f"{lock['driver']}-1",
                         "intel-microcode": "3.20230808.1~deb12u1"},
              "kernel_upgradable": ["linux-image-amd64"], "cpu_vendor": "intel"}
    plan = patch.plan_of(report, lock, patch.request(all_=True))
    assert plan == [f"nvidia-driver-535 535.288.01-1 -> {lock['driver']}-*",
                    "linux-image-amd64 -> newest",
                    f"intel-microcode 3.20230808.1~deb12u1 -> {lock['microcode']['intel']}"]
    converged = {"before": {"nvidia-driver-535": f"{lock['driver']}-1", "nvidia-dkms-535": f"{lock['driver']}-1"}}
    assert patch.plan_of(converged, lock, patch.request(driver="535")) == []
    # A node whose check run failed has no report: no plan lines (its plan_error says why), not
    # every package of the lock as "not installed".
    assert patch.plan_of({}, lock, patch.request(all_=True)) == []


def test_kernel_module_alone_moves_the_driver_and_is_checked() -> None:
    req = patch.request(kernel_module="open")
    assert req.move_driver and req.driver is None and req.kernel_module == "open"
    with pytest.raises(BadInput, match="unknown kernel module 'closed'"):
        patch.request(kernel_module="closed")
    # The resolver's flavour rules hold for a move too: Volta cannot take the open modules.
    old = stack.resolve("p3.2xlarge", source="nvidia").as_dict()
    with pytest.raises(BadInput, match="open kernel modules cannot drive V100"):
        patch.new_lock(old, patch.request(kernel_module="open"))


def test_branch_and_flavour_move_plan_lists_packages_in_out_and_the_reboot() -> None:
    """R535 proprietary (NVIDIA's names, no release pin) to R580 open (release pin first, fabric
    manager with it on an NVSwitch type): what goes, what comes, the reboot it needs."""
    old = stack.resolve("p4d.24xlarge", source="nvidia", driver="535", kernel_module="proprietary").as_dict()
    new = patch.new_lock(old, patch.request(driver="580", kernel_module="open"))
    v580, v535 = new["driver"], old["driver"]
    assert (new["kernel_module"], new["fabricmanager"]) == ("open", v580)
    assert new["packages"]["pinning"] == f"nvidia-driver-pinning-{v580}"
    before = {"nvidia-driver-535": f"{v535}-1", "nvidia-dkms-535": f"{v535}-1",
              "nvidia-fabricmanager-535": f"{v535}-1", "libnvidia-compute-535": f"{v535}-1"}
    report = {"before": before, "container": False, "gpus": 8}
    plan = patch.plan_of(report, new, patch.request(driver="580", kernel_module="open"), old)
    assert plan == [
        f"nvidia-driver-pinning-{v580} not installed -> installed",
        f"nvidia-driver-580-open not installed -> {v580}-*",
        f"nvidia-dkms-580-open not installed -> {v580}-*",
        f"nvidia-fabricmanager not installed -> {v580}-*",
        f"nvidia-driver-535 {v535}-1 -> removed",
        f"nvidia-dkms-535 {v535}-1 -> removed",
        f"nvidia-fabricmanager-535 {v535}-1 -> removed",
        "reboot: only if the nvidia module cannot be reloaded (and reboots are allowed)",
    ]
    on_container = patch.plan_of({**report, "container": True}, new, patch.request(driver="580"), old)
    assert on_container[-1] == "reboot: none (container node: it shares the kernel of its host)"
    # A node already there: nothing to move, no reboot line.
    there = {"before": {f"nvidia-driver-pinning-{v580}": "1.0", "nvidia-driver-580-open": f"{v580}-1",
                        "nvidia-dkms-580-open": f"{v580}-1", "nvidia-fabricmanager": f"{v580}-1"},
             "container": False, "gpus": 8}
    assert patch.plan_of(there, new, patch.request(driver="580"), old) == []


def test_debian_rollback_plan_lists_the_earlier_release() -> None:
    old = stack.resolve("g5.xlarge", source="distro").as_dict()
    new = patch.new_lock(old, patch.request(driver="535.261.03"))
    assert (new["driver"], new["kernel_module"]) == ("535.261.03", "proprietary")
    before = {"nvidia-driver": "535.309.01-0+deb12u1", "nvidia-kernel-dkms": "535.309.01-0+deb12u1",
              "nvidia-smi": "535.309.01-0+deb12u1"}
    plan = patch.plan_of({"before": before, "container": True, "gpus": 0}, new,
                         patch.request(driver="535.261.03"), old)
    assert plan == [f"{name} 535.309.01-0+deb12u1 -> 535.261.03-*" for name in before] + [
        "reboot: none (container node: it shares the kernel of its host)"]


def test_moved_and_regressions() -> None:
    assert patch.moved_of({"before": {"a": "1", "b": "1"}, "after": {"a": "2", "c": "1"}}) == [
        "a 1 -> 2", "c none -> 1", "b 1 -> removed"]
    before = [{"probe": "x", "status": "fail", "detail": ""}, {"probe": "y", "status": "pass", "detail": ""}]
    after = [{"probe": "x", "status": "fail", "detail": "still"}, {"probe": "y", "status": "fail", "detail": "new"}]
    assert patch.regressions(before, after) == ["y: new"]


def test_batches() -> None:
    assert patch.batches_of(["a", "b", "c"], 2) == [["a", "b"], ["c"]]
    assert patch.batches_of([], 1) == []


def test_host_reports_read_from_job_events(tmp_path: Path) -> None:
    events = tmp_path / "job_events"
    events.mkdir()
    (events / "1-x.json").write_text(json.dumps({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": patch.REPORT_TASK, "res": {"msg": {"rebooted": False}}}}))
    (events / "2-x.json").write_text(json.dumps({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "other", "res": {"msg": "hi"}}}))
    assert patch.host_reports(tmp_path) == {"n1": {"rebooted": False}}


def test_hook_gets_the_node_and_its_failure_is_reported() -> None:
    from gpuprov.state import NodeRecord

    node = NodeRecord("n1", "id", "10.0.0.1", 22, "root", "running")
    hook = 'test "$GPUPROV_NODE:$GPUPROV_HOOK" = n1:drain'
    assert patch.run_hook(hook, "c", node, "drain") == (True, "drain hook exited 0")
    ok, detail = patch.run_hook("echo busy >&2; exit 3", "c", node, "drain")
    assert not ok and detail == "drain hook exited 3: busy"


# -- the microcode role's revision reader (roles/microcode/files/gpuprov_microcode.fact) ------------
def _fact_module():
    path = ROOT / "roles" / "microcode" / "files" / "gpuprov_microcode.fact"
    loader = importlib.machinery.SourceFileLoader("gpuprov_microcode_fact", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_microcode_fact_reads_intel_and_amd_revisions(tmp_path: Path, monkeypatch) -> None:
    fact = _fact_module()
    # Intel: 06-8f-08 (Sapphire Rapids, signature 0x806f8), two updates in one file.
    intel = tmp_path / "intel-ucode"
    intel.mkdir()
    blob = b""
    for rev in (0x2B000181, 0x2B000461):
        blob += struct.pack("<9I", 1, rev, 0, 0x806F8, 0, 1, 0x87, 2000, 2048) + b"\0" * 12 + b"\0" * 2000
    (intel / "06-8f-08").write_bytes(blob)
    monkeypatch.setattr(fact, "INTEL_DIR", intel)
    assert fact.intel_revision({"family": 6, "model": 0x8F, "stepping": 8}) == 0x2B000461
    assert fact.signature(6, 0x8F, 8) == 0x806F8
    # AMD: family 19h model 01h stepping 1 (signature 0xa00f11), equivalence id 0xa011.
    amd = tmp_path / "amd-ucode"
    amd.mkdir()
    table = struct.pack("<IIIHH", 0xA00F11, 0, 0, 0xA011, 0) + b"\0" * 16
    patch_body = struct.pack("<II", 0, 0x0A0011D5) + b"\0" * 16 + struct.pack("<H", 0xA011) + b"\0" * 6
    data = b"DMA\0" + struct.pack("<II", 0, len(table)) + table + struct.pack("<II", 1, len(patch_body)) + patch_body
    (amd / "microcode_amd_fam19h.bin").write_bytes(data)
    monkeypatch.setattr(fact, "AMD_DIR", amd)
    assert fact.amd_revision({"family": 0x19, "model": 1, "stepping": 1}) == 0x0A0011D5


def test_a_node_the_roll_never_reached_is_not_started() -> None:
    """Trust review finding 13: a node with nothing to move was reported `unchanged` even when
    the roll stopped before it; it is `unchanged` only once the roll has finished."""
    hosts = {"a": {"status": "patched"}, "b": {"status": "failed"},
             "c": {"status": "not-started", "nothing_to_move": True}}
    stopped = {h: dict(s) for h, s in hosts.items()}
    for state in stopped.values():  # what a stopped roll leaves (the finally clause)
        state.pop("nothing_to_move", None)
    assert stopped["c"] == {"status": "not-started"}
    patch._settle(hosts)  # a roll that finished
    assert hosts["c"] == {"status": "unchanged"} and hosts["a"]["status"] == "patched"


def test_a_driver_move_resolves_the_lock_once(monkeypatch: pytest.MonkeyPatch, gpuprov_home) -> None:
    """`patch --driver` resolves the new lock once: the plays' variables take a lock that has
    every field as it is (an older lock is still completed from today's data)."""
    from gpuprov import settings
    from gpuprov.state import ClusterRecord

    old = stack.resolve("p4d.24xlarge", driver="535").as_dict()
    cluster = ClusterRecord(name="c", provider="aws", created="t0", state="bootstrapped", spec={"options": {}},
                            lock=old)
    calls: list[str] = []
    real = stack.resolve_types
    monkeypatch.setattr(stack, "resolve_types", lambda *a, **k: calls.append("resolve") or real(*a, **k))
    lock = patch.new_lock(old, patch.request(driver="580"))
    assert settings.playbook_vars(cluster, lock)["gpuprov_stack"] == lock
    assert calls == ["resolve"]
    older = {k: v for k, v in lock.items() if k not in ("dcgm", "dcgm_package")}  # a lock of before DCGM
    assert settings.playbook_vars(cluster, older)["gpuprov_stack"]["dcgm"] == lock["dcgm"]
    assert calls == ["resolve", "resolve"]
