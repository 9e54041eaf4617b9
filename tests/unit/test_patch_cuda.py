"""`gpuprov patch --cuda LINE`: the request, the new lock the resolver gives (every piece of
the line moves, the driver stays, the resolver's rules hold), the plan read off a node's
check-mode report, and the playbook variables. The move itself runs on a real node in
tests/e2e/test_cuda13_e2e.py."""

from __future__ import annotations

import pytest

from gpuprov.core import patch, patch_plan
from gpuprov.errors import BadInput
from gpuprov.lock import cuda_lines, stack
from tests.conftest import run_cli


def _mirror(cuda: str = "11.8", driver: str = "580") -> dict:
    return stack.resolve(None, source="mirror", cuda=cuda, driver=driver).as_dict()


def test_cuda_alone_is_something_to_patch_and_is_spelled_as_a_line() -> None:
    assert patch.request(cuda="13").cuda == "13.0"
    assert patch.request(cuda="13.x").cuda == "13.0"
    assert patch.request(cuda="11.8").move_driver is False
    with pytest.raises(BadInput, match=r"expected a CUDA line like 11\.8"):
        patch.request(cuda="latest")


def test_new_lock_moves_every_piece_of_the_line_and_keeps_the_driver() -> None:
    old = _mirror()
    new = patch.new_lock(old, patch.request(cuda="13"))
    want = _mirror("13.0")
    for key in patch_plan.CUDA_KEYS:
        assert new.get(key) == want.get(key), key
    assert {k: v for k, v in new["packages"].items()} == want["packages"]
    for key in ("driver", "driver_branch", "kernel_module", "fabricmanager", "source", "os", "microcode"):
        assert new.get(key) == old.get(key), key
    # The archives of the line, cuDNN's as the lock's own cudnn_archive.
    assert [a["component"] for a in new["cuda_archives"]] + ["cudnn"] == \
        [a["component"] for a in cuda_lines.own_archives("13.0")]
    assert new["cudnn_archive"] == "cudnn-linux-x86_64-9.17.1.4_cuda13-archive.tar"
    assert new["hash"] == stack.from_dict({k: v for k, v in new.items() if k != "hash"}).short_hash() != old["hash"]
    # And back: a 13.0 cluster's move to 11.8 gives the 11.8 lock's pieces (its base images too).
    back = patch.new_lock(new, patch.request(cuda="11.8"))
    assert {k: back.get(k) for k in patch_plan.CUDA_KEYS} == {k: old.get(k) for k in patch_plan.CUDA_KEYS}
    assert back["hash"] == old["hash"]


def test_the_same_line_moves_nothing() -> None:
    old = _mirror()
    assert patch.new_lock(old, patch.request(cuda="11.8")) == old


def test_new_lock_holds_the_resolvers_rules() -> None:
    # CUDA 13.0 needs R580: a cluster on R535 is told so (and moves both with --driver 580).
    with pytest.raises(BadInput, match="535"):
        patch.new_lock(_mirror(driver="535"), patch.request(cuda="13"))
    both = patch.new_lock(_mirror(driver="535"), patch.request(cuda="13", driver="580"))
    assert (both["cuda"], both["driver_branch"]) == ("13.0", "580")
    # A line gpuprov does not install from the cluster's source is refused, naming what it installs.
    with pytest.raises(BadInput, match=r"--cuda 12\.9: CUDA 12\.9 resolves .* does not install it yet"):
        patch.new_lock(_mirror(), patch.request(cuda="12.9"))
    distro = stack.resolve(None, source="distro").as_dict()
    with pytest.raises(BadInput, match=r"--cuda 13\.0"):
        patch.new_lock(distro, patch.request(cuda="13"))
    # Volta under CUDA 13: the architecture rule, with the line that works.
    volta = stack.resolve("p3.2xlarge", source="mirror", driver="580").as_dict()
    with pytest.raises(BadInput, match="sm_75"):
        patch.new_lock(volta, patch.request(cuda="13"))


def test_plan_names_the_line_how_it_comes_and_what_leaves() -> None:
    old = _mirror()
    new = patch.new_lock(old, patch.request(cuda="13"))
    report = {"before": {}, "cuda_line": "11.8",
              "cuda_leaving": {"cuda-toolkit-11-8": "11.8.0-1", "libnccl2": "2.16.5-1+cuda11.8"},
              "cuda_old_prefix": "/usr/local/cuda-11.8"}
    assert patch.plan_of(report, new, patch.request(cuda="13"), old) == [
        "CUDA 11.8 -> 13.0 (NVIDIA's redist archives from the artifact mirror: cuda_nvcc, cuda_cudart, "
        "cuda_cccl, nccl; cuDNN 9.17.1.4, NCCL 2.27.7)",
        "cuda-toolkit-11-8 11.8.0-1 -> removed",
        "libnccl2 2.16.5-1+cuda11.8 -> removed",
        "/usr/local/cuda-11.8 -> removed"]
    # The way back comes as packages; a node already on the line has nothing to move.
    back = patch.plan_of({"before": {}, "cuda_line": "13.0", "cuda_old_prefix": "/usr/local/cuda-13.0"}, old,
                         patch.request(cuda="11.8"), new)
    assert back[0] == "CUDA 13.0 -> 11.8 (cuda-toolkit-11-8 11.8.0-*; cuDNN 8.9.6.50, NCCL 2.16.5)"
    assert patch.plan_of({"before": {}, "cuda_line": "13.0"}, new, patch.request(cuda="13"), old) == []


def test_playbook_variables_name_the_line_left() -> None:
    old = _mirror()
    new = patch.new_lock(old, patch.request(cuda="13"))
    base = {"gpuprov_mirror_url": "http://mirror.invalid/"}
    out = patch.patch_vars(base, patch.request(cuda="13"), new, old)
    assert (out["gpuprov_patch_cuda"], out["gpuprov_patch_cuda_from"], out["gpuprov_patch_driver"]) == (True, "11.8", False)
    # The line the cluster runs: applied again (a node that lost a piece of it gets it back).
    same = patch.patch_vars(base, patch.request(cuda="11.8"), old, old)
    assert (same["gpuprov_patch_cuda"], same["gpuprov_patch_cuda_from"]) == (True, "11.8")
    none = patch.patch_vars(base, patch.request(kernel=True), old, old)
    assert (none["gpuprov_patch_cuda"], none["gpuprov_patch_cuda_from"]) == (False, "")
    with pytest.raises(BadInput, match="--mirror-url and --mirror-key-fingerprint for the CUDA move"):
        patch.patch_vars({"gpuprov_mirror_url": ""}, patch.request(cuda="13"), new, old)


def test_cli_refuses_a_bad_line_with_one_line_and_exit_2(gpuprov_home) -> None:
    proc = run_cli("patch", "nosuch", "--cuda", "x1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuprov: --cuda 'x1': expected a CUDA line like 11.8, 12.9 or 13 (lines: {cuda_lines.listing()})"]
