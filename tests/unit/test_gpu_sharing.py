"""GPU sharing (issue 58, in part): the MIG layouts as data, the nvidia-smi MIG parsers on real
recordings (tests/fixtures/recordings/mig-published/, h100-sxm5-580/, h200-580/, each with its
source), the plan that would apply a sharing, the `gpu_sharing_matches_the_lock` probes on those
recordings and their edited copies, and the lock's refusals."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.errors import BadInput
from gpuprov.lock import stack
from gpuprov.probes import test_gpu_sharing as probes
from gpuprov.probes.conftest import Expectation
from gpuprov.sharing import choice, layouts, plan, smi

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
PUB = REC / "mig-published"


def text(path: str) -> str:
    return (REC / path).read_text()


# -- the layouts, as data ----------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "recording"), [("H100-80GB", "h100-sxm5-580/mig.txt"),
                                                  ("H200-141GB", "h200-580/mig.txt")])
def test_every_layout_fits_what_the_recorded_gpu_offers(model: str, recording: str) -> None:
    offered = {p.name: p.total for p in smi.profiles(text(recording))}
    data = layouts.models()[model]
    for name, body in data.layouts.items():
        for profile, count in body.items():
            assert count <= offered[profile], (name, profile, count, offered.get(profile))
    # every profile the real GPU offers has its all-... layout
    assert {p for body in data.layouts.values() for p in body} == set(offered)


def test_the_h100_nvl_data_names_the_profiles_its_published_lgip_shows() -> None:
    shown = {p.name: p.total for p in smi.profiles((PUB / "lgip-h100-nvl.txt").read_text())}
    assert shown == {"1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4}
    data = layouts.models()["H100-NVL-94GB"].layouts
    assert data["all-1g.12gb"] == {"1g.12gb": 7} and data["all-1g.24gb"] == {"1g.24gb": 4}


def test_each_model_file_has_its_pci_ids_and_source() -> None:
    got = {m.name: (m.gpu, m.memory_gib, m.pci_device_ids) for m in layouts.models().values()}
    assert got == {"A100-40GB": ("A100", 40, ("0x20b0", "0x20f1")), "A100-80GB": ("A100", 80, ("0x20b2", "0x20b5")),
                   "H100-80GB": ("H100", 80, ("0x2330", "0x2331")), "H100-NVL-94GB": ("H100", 94, ("0x2321",)),
                   "H200-141GB": ("H200", 141, ("0x2335",))}
    assert all("NVIDIA/mig-parted" in m.source for m in layouts.models().values())
    assert layouts.model_by_pci("0x2335").name == "H200-141GB"  # the recorded H200's id
    assert layouts.models()["A100-80GB"].renamed == {"3g.40gb": ("3g.39gb", ("535", "545"))}
    assert layouts.models()["H200-141GB"].layouts["all-balanced"] == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}


# -- the parsers, on real output ---------------------------------------------------------------------

def test_lgip_of_the_recorded_h200_and_of_a_published_one() -> None:
    mine = smi.profiles(text("h200-580/mig.txt"))
    assert [(p.name, p.id, p.total) for p in mine] == [
        ("1g.18gb", 19, 7), ("1g.18gb+me", 20, 1), ("1g.35gb", 15, 4), ("2g.35gb", 14, 3), ("3g.71gb", 9, 2),
        ("4g.71gb", 5, 1), ("7g.141gb", 0, 1)]
    assert mine[-1].memory_gib == 140.0 and mine[-1].sms == 132
    theirs = smi.profiles((PUB / "lgip-h200-gpu6.txt").read_text())  # mig-parted issue 120, GPU 6
    assert [(p.gpu, p.name, p.memory_gib) for p in theirs][2] == (6, "1g.35gb", 32.25)
    assert [p.name for p in theirs] == [p.name for p in mine[:6]]


def test_lgi_lists_each_gpu_instance_with_its_placement() -> None:
    found = smi.gpu_instances((PUB / "lgi-all-balanced-80gb.txt").read_text())
    assert len(found) == 8 and found[3] == smi.GpuInstance(0, "3g.40gb", 9, 2, (4, 4))
    assert smi.instances_per_gpu(found) == {0: Counter({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
                                            1: Counter({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})}
    assert smi.gpu_instances("No GPU instances found: Not Found\n") == []


def test_lci_lists_the_compute_instances() -> None:
    found = smi.compute_instances((PUB / "lci-a100-pcie-40gb.txt").read_text())
    assert [ci.gpu_instance for ci in found] == [7, 8, 9, 11, 12, 13]
    assert found[0] == smi.ComputeInstance(0, 7, "1g.5gb", 0, 0, (0, 1))


def test_dash_l_gives_each_gpu_its_mig_devices_and_uuids() -> None:
    gpus = smi.gpus((PUB / "L-a100-sxm4-80gb-all-1g.10gb.txt").read_text())
    assert [(g.name, len(g.mig)) for g in gpus] == [("NVIDIA A100-SXM4-80GB", 7)]
    assert gpus[0].mig[6] == smi.MigDevice("1g.10gb", 6, "MIG-1aae4990-b962-574e-8375-119d6d9b9687")
    pcie = smi.gpus((PUB / "L-a100-80gb-pcie-3g.40gb.txt").read_text())
    assert [m.name for m in pcie[0].mig] == ["3g.40gb", "3g.40gb"]
    plain = smi.gpus(text("h100-sxm5-580/nvidia-smi-L.txt"))
    assert plain[0].uuid == "GPU-de57134f-df90-8214-8509-3b5d4da69d55" and plain[0].mig == ()


def test_mig_mode_from_q_and_x_q_on_the_real_gpus_and_the_edited_copies() -> None:
    for folder in ("h100-sxm5-580", "h200-580"):
        xml = smi.mig_modes_xml(text(f"{folder}/nvidia-smi-q-x.txt"))
        assert [(m.current, m.pending, m.devices, m.reset_pending) for m in xml] == [("Disabled", "Disabled", 0, False)]
        assert [(m.gpu, m.current, m.pending) for m in smi.mig_modes(text(f"{folder}/nvidia-smi-q.txt"))] == \
            [(xml[0].gpu, "Disabled", "Disabled")]
    pending = smi.mig_modes_xml(text("h100-sxm5-580-edited-mig-pending/nvidia-smi-q-x.txt"))[0]
    assert (pending.current, pending.pending, pending.reset_pending) == ("Disabled", "Enabled", True)
    # a GPU without MIG (the public g5's A10G report): N/A
    assert {m.current for m in smi.mig_modes(text("g5-xlarge/nvidia-smi-q.txt"))} == {"N/A"}


# -- the plan ------------------------------------------------------------------------------------------

def _gpu(index: int, current: str, pending: str, lgi: str | None = None, computes: int | None = None) -> plan.GpuState:
    have = smi.instances_per_gpu(smi.gpu_instances(lgi or "")).get(index, Counter())
    return plan.GpuState(index, smi.MigMode(f"gpu{index}", current, pending, 0), have,
                         sum(have.values()) if computes is None else computes)


LGI = (PUB / "lgi-all-balanced-80gb.txt").read_text()
BALANCED = layouts.models()["H100-80GB"].layouts["all-balanced"]
ONE_G = layouts.models()["H100-80GB"].layouts["all-1g.10gb"]


def _what(steps: list[plan.Step]) -> list[str]:
    return [" ".join(s.command) for s in steps]


def test_a_node_that_matches_plans_nothing() -> None:
    mig = choice.parse("mig:all-balanced")
    assert plan.plan(mig, BALANCED, [_gpu(0, "Enabled", "Enabled", LGI), _gpu(1, "Enabled", "Enabled", LGI)]) == []
    assert plan.plan(choice.parse("shard:4"), None, [_gpu(0, "Disabled", "Disabled")]) == []
    assert plan.plan(choice.parse("mps"), None, [_gpu(0, "N/A", "N/A")]) == []


def test_turning_mig_on_stops_every_client_resets_creates_and_starts_them_again() -> None:
    steps = _what(plan.plan(choice.parse("mig:all-1g.10gb"), ONE_G, [_gpu(0, "Disabled", "Disabled")]))
    assert steps == [
        "systemctl stop slurmd", "systemctl stop nvidia-device-plugin", "systemctl stop gpuprov-dcgm-exporter",
        "systemctl stop dcgm-exporter",
        "systemctl stop nvidia-dcgm", "systemctl stop nvidia-fabricmanager", "systemctl stop nvidia-persistenced",
        "nvidia-smi -i 0 -mig 1", "nvidia-smi --gpu-reset -i 0",
        "nvidia-smi mig -i 0 -cgi 1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb -C",
        "systemctl start nvidia-persistenced", "systemctl start nvidia-fabricmanager",
        "systemctl start nvidia-dcgm", "systemctl start dcgm-exporter", "systemctl start gpuprov-dcgm-exporter",
        "systemctl start nvidia-device-plugin",
        "systemctl start slurmd"]


def test_a_mode_change_pending_a_reset_is_finished_by_the_reset_alone() -> None:
    steps = plan.plan(choice.parse("mig:all-1g.10gb"), ONE_G, [_gpu(0, "Disabled", "Enabled")])
    body = [s for s in steps if s.what not in ("stop", "start")]
    assert [(s.what, s.why) for s in body][:1] == [("reset", "the MIG mode change waits for it")]
    assert [s.what for s in body] == ["reset", "create"]


def test_a_new_layout_replaces_the_instances_without_a_reset() -> None:
    steps = plan.plan(choice.parse("mig:all-1g.10gb"), ONE_G, [_gpu(0, "Enabled", "Enabled", LGI)])
    assert "systemctl stop nvidia-persistenced" not in _what(steps)  # no reset: the driver's clients stay
    assert [s.what for s in steps if s.gpu == 0] == ["destroy", "destroy", "create"]


def test_a_missing_instance_or_compute_instance_is_a_mismatch() -> None:
    edited = text("mig-published-edited-instance-missing/lgi.txt")
    mig = choice.parse("mig:all-balanced")
    steps = plan.plan(mig, BALANCED, [_gpu(0, "Enabled", "Enabled", edited), _gpu(1, "Enabled", "Enabled", edited)])
    assert {s.gpu for s in steps if s.what == "create"} == {1}
    assert plan.plan(mig, BALANCED, [_gpu(0, "Enabled", "Enabled", LGI, computes=3)])[0].what == "stop"


def test_leaving_mig_destroys_the_instances_and_resets() -> None:
    steps = plan.plan(choice.parse("mps"), None, [_gpu(0, "Enabled", "Enabled", LGI)])
    assert [s.what for s in steps if s.gpu == 0] == ["destroy", "destroy", "set-mode", "reset"]
    assert _what(steps)[7:11] == ["nvidia-smi mig -i 0 -dci", "nvidia-smi mig -i 0 -dgi", "nvidia-smi -i 0 -mig 0",
                                  "nvidia-smi --gpu-reset -i 0"]


def test_the_535_name_of_a100_80gbs_3g_profile_matches_the_layout() -> None:
    model = layouts.models()["A100-80GB"]
    renamed = {other: name for name, (other, _) in model.renamed.items()}
    old = LGI.replace("MIG 3g.40gb", "MIG 3g.39gb")  # in memory: driver 535/545's name (mig-parted issue 31)
    assert plan.plan(choice.parse("mig:all-balanced"), model.layouts["all-balanced"],
                     [_gpu(0, "Enabled", "Enabled", old)], renamed) == []


# -- the choice ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "said"), [
    ("mig:all-1g.10gb,mps", "MIG and MPS together are not offered"),
    ("mps,shard:4", "one mode at a time"),
    ("shard:1", "shard:1 is the whole GPU"),
    ("shard:65", "from 2 to 64"),
    ("shard:x", "from 2 to 64"),
    ("mig:", "'' is no MIG layout name"),
    ("mig:all 1g; rm -rf /", "is no MIG layout name"),
    ("time-slicing", "expected mig:LAYOUT, mps, shard:N (N from 2 to 64) or none"),
])
def test_a_malformed_value_is_one_line(value: str, said: str) -> None:
    with pytest.raises(BadInput, match=r"^--gpu-sharing ") as exc:
        choice.parse(value)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_the_values_as_the_lock_records_them() -> None:
    assert [choice.parse(v).spelled() for v in ("mig:all-balanced", "mps", "shard:4", "none", None)] == \
        ["mig:all-balanced", "mps", "shard:4", "", ""]


# -- the lock ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("itype", "value", "said"), [
    ("g5.xlarge", "mig:all-1g.10gb", "g5.xlarge's A10G has no MIG"),
    ("g4dn.xlarge", "mig:all-1g.10gb", "g4dn.xlarge's T4 has no MIG"),
    ("p3.2xlarge", "mig:all-1g.10gb", "p3.2xlarge's V100 has no MIG"),
    ("g6.xlarge", "mig:all-balanced", "g6.xlarge's L4 has no MIG"),
    ("g6e.xlarge", "mig:all-balanced", "g6e.xlarge's L40S has no MIG"),
    ("p6-b200.48xlarge", "mig:all-balanced", "gpuprov has no MIG layouts for p6-b200.48xlarge's B200 yet"),
    ("p5.48xlarge", "mig:all-1g.18gb", "not a layout of H100-80GB (p5.48xlarge); its layouts: all-1g.10gb,"),
    ("p4d.24xlarge", "mig:all-7g.80gb", "not a layout of A100-40GB (p4d.24xlarge); its layouts: all-1g.5gb,"),
    ("docker-node", "mig:all-9g.1gb", "no GPU model gpuprov knows has that layout"),
])
def test_the_resolver_refuses_what_the_gpu_cannot_have(itype: str, value: str, said: str) -> None:
    with pytest.raises(BadInput) as exc:
        stack.resolve(itype, gpu_sharing=value)
    assert said in str(exc.value) and "\n" not in str(exc.value)
    if "has no MIG" in said:
        assert "mps" in str(exc.value) and "shard:N" in str(exc.value)


def test_the_lock_records_the_sharing_and_keeps_the_hash_of_a_lock_without() -> None:
    plain = stack.resolve("p4de.24xlarge")
    mig = stack.resolve("p4de.24xlarge", gpu_sharing="mig:all-1g.10gb")
    assert plain.gpu_sharing == "" and mig.gpu_sharing == "mig:all-1g.10gb"
    assert mig.short_hash() != plain.short_hash()
    assert stack.resolve("p4de.24xlarge", gpu_sharing="none").short_hash() == plain.short_hash()
    stored = {k: v for k, v in plain.as_dict().items() if k not in ("gpu_sharing", "hash")}
    assert stack.from_dict(stored).short_hash() == plain.short_hash()  # a lock stored before the field
    assert mig.public()["gpu_sharing"] == {"mode": "mig", "value": "mig:all-1g.10gb", "layout": "all-1g.10gb",
                                           "model": "A100-80GB", "instances_per_gpu": {"1g.10gb": 7}, "gpus": 8,
                                           "shards_per_gpu": None}
    assert plain.public()["gpu_sharing"] is None


def test_a_host_of_unknown_gpu_records_the_layout_with_a_note() -> None:
    lock = stack.resolve(None, gpu_sharing="mig:all-1g.18gb")
    assert lock.gpu_sharing == "mig:all-1g.18gb"
    assert any("checked against the model the node shows" in n for n in lock.notes)


# -- the probes, on the recordings ----------------------------------------------------------------------

class Host:
    """FIXTURE: testinfra's host for the gpu_sharing probes: each command line the probes run is
    answered by the recording named for it (any other command fails the test)."""

    def __init__(self, **answers: str) -> None:
        self.answers = {probes.MIG_MODE_COMMAND: answers.get("q_x", ""), "nvidia-smi mig -lgi": answers.get("lgi", ""),
                        "pgrep -x nvidia-cuda-mps-control": answers.get("mps", "")}

    def run(self, command: str) -> SimpleNamespace:
        assert command in self.answers, command
        out = self.answers[command]
        return SimpleNamespace(rc=0 if out else 1, stdout=out, stderr="")


def _expect(sharing: str, itype: str = "p5.48xlarge", gpus: int = 2) -> Expectation:
    lock = stack.resolve(itype, gpu_sharing=sharing).as_dict()
    return Expectation(node="n1", instance_type=itype, gpus=gpus, gpu_model=lock["gpu"], nvswitch=None,
                       virtualization="vm", stack=lock)


def _two_gpus(path: str) -> str:
    """The H100's -q -x report with its one <gpu> twice (the published -lgi has two GPUs)."""
    one = text(path)
    start, end = one.index("\t<gpu id="), one.index("\t</gpu>") + len("\t</gpu>\n")
    return one[:end] + one[start:end] + one[end:]


ON = _two_gpus("h100-sxm5-580-edited-mig-on/nvidia-smi-q-x.txt")


def _run(probe, host: Host, expect: Expectation) -> list[str]:
    said: list[str] = []
    probe(host, expect, said.append)
    return said


def test_the_probes_pass_on_the_matching_recordings() -> None:
    expect, host = _expect("mig:all-balanced"), Host(q_x=ON, lgi=LGI)
    assert _run(probes.test_gpu_sharing_matches_the_lock_mig_mode, host, expect) == \
        ["MIG mode Enabled on 2 GPU(s), as mig:all-balanced needs"]
    assert _run(probes.test_gpu_sharing_matches_the_lock_no_mig_mode_change_pending, host, expect)
    assert _run(probes.test_gpu_sharing_matches_the_lock_mig_instances, host, expect) == \
        ["2 x 1g.10gb + 1 x 2g.20gb + 1 x 3g.40gb on each GPU (mig:all-balanced, H100-80GB)"]
    real = _two_gpus("h100-sxm5-580/nvidia-smi-q-x.txt")
    assert _run(probes.test_gpu_sharing_matches_the_lock_mig_mode, Host(q_x=real), _expect("shard:4")) == \
        ["MIG mode Disabled on 2 GPU(s), as shard:4 needs"]


def test_the_instances_probe_fails_on_a_mismatched_layout_and_a_missing_instance() -> None:
    with pytest.raises(AssertionError, match=r"expected 7 x 1g\.10gb on each GPU \(mig:all-1g\.10gb, H100-80GB\), "
                                             r"found GPU 0: 2 x 1g\.10gb \+ 1 x 2g\.20gb \+ 1 x 3g\.40gb; GPU 1: "):
        probes.test_gpu_sharing_matches_the_lock_mig_instances(Host(q_x=ON, lgi=LGI), _expect("mig:all-1g.10gb"),
                                                               print)
    missing = text("mig-published-edited-instance-missing/lgi.txt")
    with pytest.raises(AssertionError, match=r"found GPU 1: 1 x 1g\.10gb \+ 1 x 2g\.20gb \+ 1 x 3g\.40gb\n"):
        probes.test_gpu_sharing_matches_the_lock_mig_instances(Host(q_x=ON, lgi=missing), _expect("mig:all-balanced"),
                                                               print)


def test_the_mode_probes_fail_on_mig_off_and_on_a_change_pending_a_reset() -> None:
    real = _two_gpus("h100-sxm5-580/nvidia-smi-q-x.txt")
    with pytest.raises(AssertionError, match=r"expected MIG mode Enabled on every GPU \(mig:all-balanced in the lock\), "
                                             r"found 00000000:00:06\.0: Disabled"):
        probes.test_gpu_sharing_matches_the_lock_mig_mode(Host(q_x=real), _expect("mig:all-balanced"), print)
    pending = _two_gpus("h100-sxm5-580-edited-mig-pending/nvidia-smi-q-x.txt")
    with pytest.raises(AssertionError, match=r"expected no MIG mode change waiting for a GPU reset, found "
                                             r"00000000:00:06\.0: current Disabled, pending Enabled"):
        probes.test_gpu_sharing_matches_the_lock_no_mig_mode_change_pending(Host(q_x=pending),
                                                                           _expect("mig:all-balanced"), print)


def test_the_mps_probe_asks_for_the_control_daemon() -> None:
    assert _run(probes.test_gpu_sharing_matches_the_lock_mps_daemon, Host(mps="4242\n"), _expect("mps")) == \
        ["nvidia-cuda-mps-control running (pid 4242)"]
    with pytest.raises(AssertionError, match="expected the MPS control daemon"):
        probes.test_gpu_sharing_matches_the_lock_mps_daemon(Host(), _expect("mps"), print)


@pytest.mark.parametrize(("expect", "why"), [
    (_expect("mig:all-balanced", gpus=0), "has no GPU"),
    (_expect("none"), "asks no GPU sharing"),
    (_expect("shard:4"), "shards: Slurm time-shares the GPU; nothing on the GPU side"),
])
def test_the_probes_skip_with_the_reason(expect: Expectation, why: str) -> None:
    probe = probes.test_gpu_sharing_matches_the_lock_mps_daemon
    with pytest.raises(pytest.skip.Exception, match=why):
        probe(Host(), expect, print)


def test_the_guides_tables_are_the_data_files() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "gpu-sharing.md").read_text()
    for model in layouts.models().values():
        for name, body in model.layouts.items():
            row = f"| `mig:{name}` | " + " + ".join(f"{n} x {p}" for p, n in body.items()) + " |"
            assert row in guide.split(f"**{model.name}**", 1)[1], (model.name, row)


# -- what the roles are given (settings.playbook_vars' gpuprov_gpu_sharing) ------------------------

def test_the_roles_get_the_layouts_instances_where_the_lock_tells_the_model() -> None:
    from gpuprov import catalog

    def given(value: str, itype: str = "", gpu: str | None = None) -> dict:
        return layouts.role_inputs(choice.parse(value), catalog.find(itype), gpu)

    assert given("mig:all-balanced", "p4de.24xlarge") == {
        "instances": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, "renamed": {"3g.39gb": "3g.40gb"}}
    assert given("mig:all-1g.18gb", "p5e.48xlarge")["instances"] == {"1g.18gb": 7}
    # No model named: the models with the layout agree (H200's names are its own) or none is given.
    assert given("mig:all-1g.18gb")["instances"] == {"1g.18gb": 7}
    assert given("mig:all-1g.10gb") == {"instances": {}, "renamed": {}}  # 4 on an A100 40 GB, 7 on 80 GB
    assert given("shard:4", "p5.48xlarge") == given("mps", "p5.48xlarge") == {"instances": {}, "renamed": {}}
