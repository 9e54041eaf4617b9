"""What a host is, and the lock a cluster of such hosts gets: declared types, declared GPU
counts, and what real PCI buses showed (tests/fixtures/recordings, sources in its README)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.lock import stack

REC = Path(__file__).parents[1] / "fixtures" / "recordings"


def _bus(name: str) -> dict:
    return catalog.parse_pci((REC / name / "pci.txt").read_text())


def test_real_pci_buses_name_their_gpus() -> None:
    assert _bus("h100-sxm5-580") == {"gpu_device_ids": ["0x2330"], "nvswitches": 0}
    assert _bus("h200-580") == {"gpu_device_ids": ["0x2335"], "nvswitches": 0}
    h100 = catalog.from_hardware(_bus("h100-sxm5-580"))
    assert (h100.name, h100.gpu_model, h100.arch, h100.nvswitch) == ("detected:1xH100", "H100", "sm_90", False)


def test_nvswitch_on_the_bus_means_fabric_manager_whatever_was_declared() -> None:
    hgx = _bus("hgx-h100-edited")
    assert hgx["nvswitches"] == 4
    # Declared as a type without NVSwitch (a wrong declaration): the bus wins.
    wrong = catalog.from_hardware(hgx, catalog.get("g6e.xlarge"))
    assert wrong.nvswitch
    # Declared nothing, or only a count: the bus names the model and the switches.
    bare = catalog.from_hardware(hgx, gpus=8)
    assert (bare.gpu_count, bare.gpu_model, bare.nvswitch) == (8, "H100", True)
    lock = stack.resolve_types([bare], source="nvidia")
    assert lock.fabricmanager == lock.driver and lock.nvswitch
    # A single H100 without switches: no fabric manager.
    assert stack.resolve_types([catalog.from_hardware(_bus("h100-sxm5-580"))]).fabricmanager is None


def test_a_dgx_is_described_as_what_it_is() -> None:
    dgx = catalog.get("dgx-a100")
    assert dgx.nvswitch and dgx.infiniband and not dgx.efa and dgx.provider == "onprem"
    lock = stack.resolve_types([dgx], source="nvidia")
    assert lock.fabricmanager == lock.driver
    assert lock.efa_installer is None  # no AWS rdma-core on an InfiniBand host


def test_p4d_declared_in_a_hosts_file_gets_fabric_manager() -> None:
    lock = stack.resolve_types([catalog.get("p4d.24xlarge")], source="nvidia")
    assert lock.instance_type == "p4d.24xlarge" and lock.fabricmanager == lock.driver


def test_one_lock_serves_a_mixed_cluster() -> None:
    kinds = [catalog.get("dgx-a100"), catalog.get("g6e.xlarge")]  # A100 + NVSwitch, L40S
    lock = stack.resolve_types(kinds, source="nvidia")
    assert lock.gpu == "A100, L40S" and lock.nvswitch and lock.fabricmanager == lock.driver
    assert "dgx-a100, g6e.xlarge" in lock.instance_type
    assert any("2 kinds" in n for n in lock.notes)
    # The GPU that needs the newest driver decides: H200 needs >= 550.
    h200 = stack.resolve_types([catalog.get("dgx-a100"), catalog.from_hardware(_bus("h200-580"))])
    assert stack._v(h200.driver) >= stack._v(stack.GPU_MIN_DRIVER["H200"])
    with pytest.raises(BadInput, match="does not support H200"):
        stack.resolve_types([catalog.get("dgx-a100"), catalog.from_hardware(_bus("h200-580"))],
                            driver="535")


def test_nvswitch_hosts_from_a_source_without_fabric_manager_are_refused() -> None:
    with pytest.raises(BadInput, match="dgx-h100 has NVSwitch and needs fabric manager"):
        stack.resolve_types([catalog.get("dgx-h100"), catalog.get("docker-node")], source="distro")


def test_other_lines_and_other_vendors_are_ignored() -> None:
    text = ("/sys/bus/pci/devices/0000:00:03.0 vendor=0x1af4 device=0x1041 class=0x020000\n"
            "garbage vendor=0x10de device=0xzzzz class=0x030200\n")
    assert catalog.parse_pci(text) == {"gpu_device_ids": [], "nvswitches": 0}
    assert catalog.from_hardware(None).name == "undeclared"


def test_the_example_hosts_file_resolves_to_a_stack_with_fabric_manager() -> None:
    """The example a new user copies (a DGX A100 beside GPU-count-only hosts), no --type:
    before this, the lock was resolved for "unknown" and had no fabric manager."""
    from gpuprov.providers import ClusterSpec
    from gpuprov.providers.static import PROVIDER
    from gpuprov.providers.static.options import StaticOptions

    example = Path(__file__).parents[2] / "inventory" / "static-hosts.example.yml"
    spec = ClusterSpec(name="rack3", provider="static", instance_type=None, count=None,
                       options=StaticOptions(hosts_file=str(example)))
    kinds = PROVIDER.host_types(spec)
    assert [k.name for k in kinds] == ["dgx-a100", "declared:8xGPU", "declared:4xGPU"]
    lock = stack.resolve_types(kinds, source="nvidia")
    assert lock.fabricmanager == lock.driver and lock.efa_installer is None


def test_a_mixed_or_detected_lock_can_be_moved_by_patch() -> None:
    from gpuprov.core import patch

    kinds = [catalog.get("dgx-a100"), catalog.from_hardware(_bus("hgx-h100-edited"), gpus=8)]
    lock = stack.resolve_types(kinds, source="nvidia").as_dict()
    assert stack.kinds_of(lock)[0].gpu_model == "A100" and len(stack.kinds_of(lock)) == 2
    moved = patch.new_lock(lock, patch.request(driver="550"))
    assert moved["driver_branch"] == "550" and moved["fabricmanager"] == moved["driver"]
    assert moved["instance_type"] == lock["instance_type"]
    # A lock of one catalog type round-trips to that type.
    single = stack.resolve("p4d.24xlarge").as_dict()
    assert [k.name for k in stack.kinds_of(single)] == ["p4d.24xlarge"]
