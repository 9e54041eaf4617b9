"""gpuprov health's gathering script, Xid table and node checks (memlock, nvidia-peermem,
EFA, fabric manager): the recordings hold no gpuprov node's limits or fabric, so these are
held to the outputs the gather script's commands print, written out here."""

from __future__ import annotations

import subprocess

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.health import QUICK, checks_gpu, checks_node, gather, xid
from gpuprov.health.facts import Expect, Facts, nvlink_table
from gpuprov.health.gather import Section
from gpuprov.health.run import check_level

LOCK = {"driver": "580.159.04", "fabricmanager": "580.159.04",
        "packages": {"fabricmanager": "nvidia-fabricmanager"}}


def facts(**texts: str) -> Facts:
    return Facts({k: Section(v, 0) for k, v in texts.items()})


def test_the_script_runs_here_and_every_section_comes_back_with_its_status() -> None:
    proc = subprocess.run(["sh", "-s"], input=gather.script(), capture_output=True, text=True, timeout=60,
                          check=False)
    found = gather.split(proc.stdout)
    assert list(found) == list(gather.COMMANDS)
    assert all(s.rc is not None for s in found.values())
    assert found["uid"].text.strip().isdigit()


def test_split_keeps_a_section_cut_off_by_a_dead_connection() -> None:
    out = f"{gather.MARK} uid\n0\n{gather.MARK}-rc uid 0\n{gather.MARK} smi_q\nGPU 0000"
    found = gather.split(out)
    assert found["uid"] == Section("0", 0) and found["smi_q"] == Section("GPU 0000", None)


@pytest.mark.parametrize(("text", "action"), [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", "watch"),
])
def test_xid_154_takes_its_action_from_the_recovery_action_it_names(text: str, action: str) -> None:
    assert xid.classify(154, text)[1] == action


def test_an_xid_outside_the_table_is_named_not_hidden() -> None:
    what, action = xid.classify(999, "whatever")
    assert action == "watch" and "not in gpuprov's table" in what


def test_the_worst_action_wins_and_each_gpu_xid_is_counted_once() -> None:
    log = ("NVRM: Xid (PCI:0000:10:1c): 13, pid=1, Graphics Exception\n"
           "NVRM: Xid (PCI:0000:10:1c): 13, pid=1, Graphics Exception\n"
           "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus\n"
           "NVRM: GPU 0000:44:00.0: GPU has fallen off the bus.\n")
    found = xid.events(log)
    assert [e.xid for e in found] == [13, 13, 79]  # the driver's second line is the same event
    assert xid.worst(found) == "reboot"
    assert xid.summary(found).startswith("Xid 13 on 0000:10:1c x2")


def test_a_kernel_log_that_cannot_be_read_fails_with_how_to_read_it() -> None:
    row = checks_node.xids(facts(kernel_log="", kernel_log_source="dmesg: read kernel buffer failed: "
                                 "Operation not permitted"), Expect())
    assert row.status == "fail" and "run the health check as root" in row.action


def test_memlock_as_the_rdma_role_sets_it() -> None:
    good = facts(memlock_user="unlimited\nunlimited", memlock_pid1="unlimited unlimited", systemd="yes",
                 memlock_systemd="DefaultLimitMEMLOCK=infinity")
    assert checks_node.memlock(good, Expect()).status == "pass"
    bad = facts(memlock_user="8192\n8192", memlock_pid1="unlimited unlimited", systemd="yes",
                memlock_systemd="DefaultLimitMEMLOCK=8388608")
    row = checks_node.memlock(bad, Expect(provision="gpuprov provision demo"))
    assert row.status == "fail" and row.found == ("user session: 8 MiB (8388608 bytes) / 8 MiB (8388608 bytes); "
                                                "services: DefaultLimitMEMLOCK=8 MiB (8388608 bytes)")
    assert "gpuprov provision demo --tags rdma" in row.action
    capped = facts(container="docker", memlock_pid1="8388608 8388608", memlock_user="8192\n8192")
    assert checks_node.memlock(capped, Expect()).status == "skip"


def test_peermem_on_an_infiniband_gpu_node_and_not_on_efa() -> None:
    gpu_bus = "/sys/bus/pci/devices/0000:00:06.0 vendor=0x10de device=0x2330 class=0x030200"
    adapter = "mlx5_0 mlx5_core"
    loaded = facts(pci=gpu_bus, modules_load="nvidia-peermem", lsmod="nvidia_peermem\nnvidia", infiniband=adapter)
    assert checks_node.peermem(loaded, Expect(instance_type="dgx-h100")).status == "pass"
    missing = checks_node.peermem(facts(pci=gpu_bus, modules_load="", lsmod="nvidia", infiniband=adapter), Expect())
    assert missing.status == "fail" and "modprobe nvidia-peermem" in missing.action
    # No InfiniBand/RoCE adapter (the real H200 VM: one GPU, no Mellanox function on its bus,
    # recordings/h200-580/lspci-nn.txt): nothing for nvidia-peermem to serve, a skip with why.
    alone = checks_node.peermem(facts(pci=gpu_bus, modules_load="", lsmod="nvidia", infiniband=""), Expect())
    assert alone.status == "skip" and "no InfiniBand/RoCE device" in alone.reason
    efa = Expect(instance_type="p5.48xlarge", efa_interfaces=32)
    assert checks_node.peermem(facts(pci=gpu_bus), efa).status == "skip"


def test_efa_devices_counted_against_the_catalog() -> None:
    p4d = catalog.get("p4d.24xlarge")
    expect = Expect(instance_type=p4d.name, efa_interfaces=p4d.efa_max_interfaces)
    four = "\n".join(f"rdmap{16 + i}s27 efa" for i in range(4))
    assert checks_node.efa(facts(infiniband=four), expect).status == "pass"
    row = checks_node.efa(facts(infiniband="rdmap16s27 efa\nmlx5_0 mlx5_core"), expect)
    assert row.status == "fail" and row.found.startswith("1 EFA device(s)") and row.expected.startswith("4 EFA")


def test_fabric_manager_on_nvswitch_nodes_only() -> None:
    switches = "\n".join(f"/sys/bus/pci/devices/0000:00:0{i}.0 vendor=0x10de device=0x22a3 class=0x068000"
                         for i in range(4))
    expect = Expect(instance_type="p5.48xlarge", nvswitch=True, lock=LOCK)
    pkg = "ii nvidia-fabricmanager 580.159.04-1"
    ok = checks_gpu.fabricmanager(facts(pci=switches, fabricmanager="active", fabricmanager_pkg=pkg), expect)
    assert ok.status == "pass"
    down = checks_gpu.fabricmanager(facts(pci=switches, fabricmanager="failed", fabricmanager_pkg=pkg), expect)
    assert down.status == "fail" and "systemctl restart nvidia-fabricmanager" in down.action
    old = "ii nvidia-fabricmanager-535 535.309.01-1"
    drift = checks_gpu.fabricmanager(facts(pci=switches, fabricmanager="active", fabricmanager_pkg=old), expect)
    assert drift.status == "fail"
    assert checks_gpu.fabricmanager(facts(pci=""), Expect(lock=LOCK)).status == "skip"


def test_a_container_node_without_gpu_skips_the_gpu_checks_with_reasons() -> None:
    node = facts(container="docker", pci="", memlock_user="unlimited\nunlimited",
                 memlock_pid1="unlimited unlimited", systemd="yes", memlock_systemd="DefaultLimitMEMLOCK=infinity")
    rows = {c.__name__: c(node, Expect(instance_type="docker-node", gpus=0, lock=LOCK)) for c in QUICK}
    assert rows["gpu_count"].status == "pass"  # 0 GPUs, as the catalog says: a real verdict
    assert rows["memlock"].status == "pass"
    skipped = {k for k, r in rows.items() if r.status == "skip"}
    assert skipped == set(rows) - {"gpu_count", "memlock"}
    assert all(r.reason for r in rows.values() if r.status == "skip")
    assert rows["gpu_answers"].reason == "container node: docker-node has no GPU (catalog: 0 GPUs)"


def test_the_three_levels_are_taken_and_no_other() -> None:
    assert [check_level(x) for x in ("quick", "standard", "full")] == ["quick", "standard", "full"]
    with pytest.raises(BadInput, match="one of quick, standard, full"):
        check_level("fast")


def test_the_catalog_gives_p4d_12_and_p5_18_links_per_gpu() -> None:
    table = nvlink_table()
    assert table["p4d.24xlarge"] == 12 and table["p5.48xlarge"] == 18
    assert all(catalog.find(name) is not None for name in table)
    assert all(catalog.get(name).nvswitch for name in table)


def test_a_check_that_cannot_read_its_facts_fails_alone(monkeypatch) -> None:
    """A parser meeting a shape it has not seen (here the ECC check, made to raise) fails its
    own row naming the error; the node's other checks still judge it."""
    import gpuprov.health as health
    from gpuprov.health import checks_state

    def broken(facts, expect):
        raise KeyError("volatile")

    broken.__name__ = "ecc"
    monkeypatch.setattr(health, "QUICK", tuple(broken if c is checks_state.ecc else c for c in health.QUICK))
    node = facts(container="docker", pci="", memlock_user="unlimited\nunlimited",
                 memlock_pid1="unlimited unlimited", systemd="yes", memlock_systemd="DefaultLimitMEMLOCK=infinity")
    rows = health.evaluate("n1", node, Expect(instance_type="docker-node", gpus=0, lock=LOCK))
    by = {r.check: r for r in rows}
    assert by["ecc"].status == "fail" and "KeyError: 'volatile'" in by["ecc"].found, by["ecc"]
    assert by["ecc"].node == "n1" and "\n" not in by["ecc"].found
    assert len(rows) == len(health.QUICK)
    assert [r.check for r in rows if r.status == "fail"] == ["ecc"]
