"""`gpuprov stack --os`: Debian 12 by default (the lock it always was), Debian 13 (trixie) from its
own archive with `--source distro`, said to be proven on local nodes; every request an OS cannot
serve is one line on stderr, exit 2, nothing created. `up --os` is taken by every provider: each
refuses an OS it has no way to run, before anything is made (tests/cli/test_up_os_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.lock import stack
from tests.cli.stack_lines import invoke, one_line_exit_2


def test_stack_os_debian13_json_is_trixies_lock(capsys, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, "stack", "--type", "g5.xlarge", "--os", "debian13", "--source", "distro",
                            "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["os"], data["source"], data["driver"], data["kernel_module"]) == (
        "debian13", "distro", "550.163.01", "proprietary")
    assert (data["cuda"], data["cuda_release"], data["cuda_installable"], data["nccl"]) == (
        "12.4", "12.4.131", True, "2.22.3")  # `up` installs it from trixie's archive
    assert (data["driver_branch_kind"], data["driver_eol"]) == ("production", "2025-06")
    assert data["hash"] == stack.resolve("g5.xlarge", source="distro", os="debian13").short_hash()
    assert {r["os"]: r["proven"] for r in data["platforms"]}["debian13"] is True
    # R550 is past its end of life: one warning on stderr, Debian 13's support named.
    (warning,) = err.strip().splitlines()
    assert warning.startswith("gpuprov: warning: driver branch R550 (production) reached its end of life")
    assert "Debian 13 security support (trixie-security) applies" in warning and "R580" in warning


def test_stack_os_debian13_table_says_proven_on_local_nodes(capsys, gpuprov_home: Path) -> None:
    code, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "--os", "debian13", "--source", "distro")
    flat = " ".join(out.replace("\u2502", " ").split())  # the table's borders where a cell wraps
    assert code == 0
    assert ("os: Debian 13 (trixie), proven here (local nodes: the whole site of --source distro; the molecule "
            "scenarios of the container_runtime, gpu_preflight, microcode, monitoring, node_patch, rdma, "
            "slurm and spot_interruption roles)") in flat
    assert "does not install it yet" not in flat
    assert "NVIDIA's own debian13 repository gives R580 on trixie" in flat
    assert "Debian 13 24.11.5" in flat  # its archive's Slurm


def test_stack_default_os_is_debian12_and_its_lock_unchanged(capsys, gpuprov_home: Path) -> None:
    code, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "--source", "distro", "-o", "json")
    data = json.loads(out)
    assert code == 0 and (data["os"], data["cuda"], data["driver"]) == ("debian12", "11.8", "535.309.01")
    code, same, _ = invoke(capsys, "stack", "--type", "g5.xlarge", "--source", "distro", "--os", "debian12", "-o", "json")
    assert code == 0 and json.loads(same)["hash"] == data["hash"]
    code, out, _ = invoke(capsys, "stack", "--type", "g5.xlarge")
    assert code == 0 and "os: Debian 12 (bookworm), proven here" in " ".join(out.split())


@pytest.mark.parametrize(("args", "needle"), [
    (["--os", "debian13"], "--os debian13 with package source 'nvidia': gpuprov has not read the package names"),
    (["--os", "debian13", "--source", "mirror"], "--os debian13 with package source 'mirror'"),
    (["--os", "debian13", "--source", "distro", "--cuda", "13"], "packages CUDA 12.4 only; use --cuda 12.4"),
    (["--cuda", "12.4"], "CUDA 12.4 is packaged by Debian 13 (trixie) only: use --os debian13 --source distro"),
    (["--cuda", "12.4", "--source", "distro"], "use --os debian13 --source distro, or --cuda 11.8"),
    (["--os", "debian13", "--source", "distro", "--driver", "580"], "carries driver branch 550 only, not 580"),
    (["--os", "debian14"], "Invalid value for '--os'"),
])
def test_stack_refusals_areone_line_exit_2(capsys, gpuprov_home: Path, args: list[str], needle: str) -> None:
    code, out, err = invoke(capsys, "stack", "--type", "g5.xlarge", *args)
    if args[-1] == "debian14":  # click's own usage error: exit 2, said on stderr
        assert code == 2 and out == "" and needle in err
        return
    one_line_exit_2(code, out, err, needle)


def test_types_refuses_an_os_own_line_and_keeps_the_lines_of_every_os(capsys, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, "types", "--cuda", "12.4")
    one_line_exit_2(code, out, err, "--cuda 12.4: CUDA 12.4 is debian13's own line (`gpuprov stack --os debian13 "
                     "--source distro`), not a type's; types lists the lines of every OS: 11.8, 12.9, 13.0")
    code, out, _ = invoke(capsys, "types", "--cuda", "12", "-o", "json")
    assert code == 0 and all("12.9" in r["cuda_lines"] and "12.4" not in r["cuda_lines"] for r in json.loads(out))
