"""`--gpu-sharing` on `stack`, `up` and `patch` (issue 58, in part): the lock shows and records it;
a GPU without MIG, a layout of another model, MIG with MPS and a malformed value are each one line
on stderr, exit 2, nothing created."""

from __future__ import annotations

import json
from itertools import takewhile
from pathlib import Path

import pytest

from gpuprov.core import patch_plan
from gpuprov.errors import BadInput
from gpuprov.lock import stack
from tests.cli.stack_lines import hosts_file, invoke, one_line_exit_2, state_of


@pytest.mark.parametrize(("itype", "value", "row", "json_model", "per_gpu"), [
    ("p4de.24xlarge", "mig:all-1g.10gb", "mig:all-1g.10gb: 7 x 1g.10gb per A100-80GB; 56 MIG devices on 8 GPUs",
     "A100-80GB", {"1g.10gb": 7}),
    ("p5.48xlarge", "mig:all-balanced",
     "mig:all-balanced: 2 x 1g.10gb + 1 x 2g.20gb + 1 x 3g.40gb per H100-80GB; 32 MIG devices on 8 GPUs",
     "H100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    ("p5e.48xlarge", "mig:all-1g.18gb", "mig:all-1g.18gb: 7 x 1g.18gb per H200-141GB; 56 MIG devices on 8 GPUs",
     "H200-141GB", {"1g.18gb": 7}),
])
def test_stack_shows_the_layout_in_text_and_json(capsys, itype: str, value: str, row: str, json_model: str,
                                                 per_gpu: dict[str, int]) -> None:
    code, out, err = invoke(capsys, "stack", "--type", itype, "--gpu-sharing", value)
    assert code == 0 and not err
    assert _row(out, "gpu_sharing") == row
    code, out, err = invoke(capsys, "stack", "--type", itype, "--gpu-sharing", value, "-o", "json")
    shown = json.loads(out)["gpu_sharing"]
    assert code == 0 and (shown["value"], shown["model"], shown["instances_per_gpu"]) == (value, json_model, per_gpu)


def _row(table: str, name: str) -> str:
    """A row's value in the `stack` table, its wrapped lines joined."""
    lines = table.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(f"│ {name} "))
    cells = [lines[first].split("│")[2].strip()]
    cells += [line.split("│")[2].strip() for line in takewhile(lambda x: x.startswith("│" + " " * 5), lines[first + 1:])]
    return " ".join(c for c in cells if c)


def test_stack_shows_mps_shard_and_none(capsys) -> None:
    _, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "--gpu-sharing", "shard:4", "-o", "json")
    assert json.loads(out)["gpu_sharing"]["shards_per_gpu"] == 4
    _, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "--gpu-sharing", "mps")
    assert _row(out, "gpu_sharing") == "mps: one MPS control daemon per node; the GPU's memory is not isolated"
    _, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "-o", "json")
    assert json.loads(out)["gpu_sharing"] is None


@pytest.mark.parametrize(("args", "needle"), [
    (["--type", "g5.xlarge", "--gpu-sharing", "mig:all-1g.10gb"],
     "--gpu-sharing mig:all-1g.10gb: g5.xlarge's A10G has no MIG"),
    (["--type", "p5e.48xlarge", "--gpu-sharing", "mig:all-1g.10gb"], "not a layout of H200-141GB (p5e.48xlarge)"),
    (["--type", "p5.48xlarge", "--gpu-sharing", "mig:all-balanced,mps"], "MIG and MPS together are not offered"),
    (["--type", "p5.48xlarge", "--gpu-sharing", "shard:0"], "shards per GPU from 2 to 64"),
])
def test_stack_refuses_in_one_line(capsys, args: list[str], needle: str) -> None:
    one_line_exit_2(*invoke(capsys, "stack", *args), needle)


@pytest.mark.parametrize(("value", "needle"), [
    ("mig:all-1g.10gb", "g5.xlarge's A10G has no MIG"),
    ("mig:all-1g.10gb,mps", "MIG and MPS together are not offered"),
    ("slices:7", "expected mig:LAYOUT, mps, shard:N"),
])
def test_up_refuses_before_anything_is_created(capsys, gpuprov_home: Path, tmp_path: Path, value: str,
                                               needle: str) -> None:
    before = [row for row in state_of(gpuprov_home) if not row[1].startswith("locks/")]
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", hosts_file(tmp_path), "--type", "g5.xlarge",
                            "--name", "shared", "--gpu-sharing", value, "--yes")
    one_line_exit_2(code, out, err, needle)
    assert [row for row in state_of(gpuprov_home) if not row[1].startswith("locks/")] == before


def test_patch_records_the_new_sharing_in_the_lock_and_checks_it() -> None:
    lock = stack.resolve("p5.48xlarge").as_dict()
    req = patch_plan.request(gpu_sharing="mig:all-1g.10gb")
    moved = patch_plan.new_lock(lock, req)
    assert moved["gpu_sharing"] == "mig:all-1g.10gb" and moved["hash"] != lock["hash"]
    assert {k: v for k, v in moved.items() if k not in ("gpu_sharing", "hash")} == \
        {k: v for k, v in lock.items() if k not in ("gpu_sharing", "hash")}
    assert "GPU sharing mig:all-1g.10gb" in patch_plan.what_of(req, moved)
    assert patch_plan.patch_vars({"gpuprov_mirror_url": ""}, req, moved)["gpuprov_patch_gpu_sharing"] is True
    # The roll's plan of a node: the gpu_sharing role's steps, as node_patch reports them.
    report = {"before": {}, "gpu_sharing_steps": ["systemctl stop slurmd", "nvidia-smi -i 0 -mig 1"]}
    assert patch_plan.plan_of(report, moved, req) == ["GPU sharing: systemctl stop slurmd",
                                                      "GPU sharing: nvidia-smi -i 0 -mig 1"]
    assert patch_plan.plan_of({**report, "gpu_sharing_steps": []}, moved, req) == []
    back = patch_plan.new_lock(moved, patch_plan.request(gpu_sharing="none"))
    assert back["gpu_sharing"] == "" and back["hash"] == lock["hash"]
    with pytest.raises(BadInput, match="not a layout of H100-80GB"):
        patch_plan.new_lock(lock, patch_plan.request(gpu_sharing="mig:all-1g.18gb"))
    with pytest.raises(BadInput, match="A10G has no MIG"):
        patch_plan.new_lock(stack.resolve("g5.xlarge").as_dict(), patch_plan.request(gpu_sharing="mig:all-balanced"))


def test_patch_takes_the_option_and_refuses_a_malformed_value(capsys, gpuprov_home: Path) -> None:
    one_line_exit_2(*invoke(capsys, "patch", "demo", "--gpu-sharing", "mig:all-1g.10gb,mps"),
                    "MIG and MPS together are not offered")
    with pytest.raises(BadInput, match="--gpu-sharing MODE"):
        patch_plan.request()
