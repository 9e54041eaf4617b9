"""`patch` on a Slurm cluster: the words its drains write (gpuprov.slurm.drain). The drains
themselves run against real Slurm in tests/e2e/test_patch_e2e.py."""

from __future__ import annotations

import pytest

from gpuprov.core.patch_plan import request
from gpuprov.errors import BadInput
from gpuprov.slurm.drain import NAME, is_own, one_line


def test_a_reason_is_one_printable_line_of_bounded_length() -> None:
    assert one_line("probes failed:\n  gpu_answers\tnvidia-smi\x1b[31m hung") == (
        "probes failed: gpu_answers nvidia-smi [31m hung")
    long = one_line("x" * 1000)
    assert len(long) == 240 and long.endswith("...")


@pytest.mark.parametrize(("reason", "own"), [
    ("gpuprov patch: run 12", True),
    ("gpuprov patch failed: probes failed after the patch: x", True),
    ("gpuprov health: docker_active: docker inactive", False),
    ("by hand", False),
    ("gpuprov patchwork", False),
])
def test_only_the_rolls_own_reasons_are_its_own(reason: str, own: bool) -> None:
    assert is_own(reason) is own


@pytest.mark.parametrize(("name", "ok"), [("ip-10-0-1-5", True), ("node_1.a", True), ("-x", False),
                                          ("a b", False), ("a;reboot", False), ("", False)])
def test_slurm_node_names_are_checked(name: str, ok: bool) -> None:
    assert bool(NAME.fullmatch(name)) is ok


@pytest.mark.parametrize(("kw", "needle"), [
    ({"grace": -1}, "--grace must be 0 or more"),
    ({"grace": 5, "force": True}, "--force does not wait"),
    ({"force": True, "onto_image": "newest"}, "not with --onto-image"),
])
def test_bad_grace_and_force_are_refused(kw: dict, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        request(kernel=True, **kw)


@pytest.mark.parametrize("flags", [["--grace", "60"], ["--force"]])
def test_grace_and_force_on_a_cluster_without_slurm_are_one_line_and_no_run(capsys, gpuprov_home, flags) -> None:
    from gpuprov.state import Store
    from tests.conftest import invoke

    Store().create_cluster("rack3", "static", {})
    code, out, err = invoke(capsys, "patch", "rack3", "--kernel", *flags)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "'rack3' runs none" in err, err
    assert Store().runs("rack3") == []
