"""CUDA lines on the command line: `stack` resolves 11.8, 12.9 and 13 (table and JSON), `types`
marks them, and `up` refuses a line gpuprov does not install yet with one line, exit 2, nothing
created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.lock import stack
from gpuprov.state import Store
from tests.cli.stack_lines import hosts_file, invoke, one_line_exit_2, state_of


@pytest.mark.parametrize("asked", ["12.9", "12", "13", "13.x", "13.0"])
def test_stack_shows_the_new_lines_for_b200(capsys, gpuprov_home: Path, asked: str) -> None:
    code, out, err = invoke(capsys, "stack", "--type", "p6-b200.48xlarge", "--cuda", asked, "-o", "json")
    assert code == 0 and err == "", err
    data = json.loads(out)
    line = "12.9" if asked.startswith("12") else "13.0"
    assert (data["cuda"], data["cuda_installable"], data["driver_branch"]) == (line, False, "580")
    assert data["cuda_release"] == {"12.9": "12.9.1", "13.0": "13.0.2"}[line]
    assert data["hash"] == stack.resolve("p6-b200.48xlarge", cuda=line).short_hash()
    code, out, err = invoke(capsys, "stack", "--type", "p6-b200.48xlarge", "--cuda", asked)
    assert code == 0 and f"│ cuda               │ {line}" in out
    assert "gpuprov does not install it yet" in out


def test_stack_refusals_name_what_works(capsys, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, "stack", "--type", "p6-b200.48xlarge")
    one_line_exit_2(code, out, err, "use --cuda 13.0 or --cuda 12.9")
    code, out, err = invoke(capsys, "stack", "--type", "p3.2xlarge", "--cuda", "13")
    one_line_exit_2(code, out, err, "V100 (sm_70, Volta) on p3.2xlarge: CUDA 13.0 supports sm_75 and newer")
    code, out, err = invoke(capsys, "stack", "--type", "p5.48xlarge", "--cuda", "12.9", "--driver", "570")
    one_line_exit_2(code, out, err, "CUDA 12.9 needs driver >= 575.57.08")


def test_stack_default_line_is_unchanged(capsys, gpuprov_home: Path) -> None:
    code, out, _ = invoke(capsys, "stack", "--type", "p4d.24xlarge", "-o", "json")
    data = json.loads(out)
    assert code == 0 and (data["cuda"], data["cuda_release"], data["cuda_installable"]) == ("11.8", "11.8.0", True)
    assert data["hash"] == stack.resolve("p4d.24xlarge").short_hash()


def test_types_marks_the_cuda_lines(capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(capsys, "types", "-o", "json")
    rows = {r["instance_type"]: r for r in json.loads(out)}
    assert code == 0
    assert rows["p6-b200.48xlarge"]["cuda_lines"] == ["12.9", "13.0"]
    assert rows["p3.2xlarge"]["cuda_lines"] == ["11.8", "12.9"]
    assert rows["g5.xlarge"]["cuda_lines"] == ["11.8", "12.9", "13.0"]
    monkeypatch.setenv("COLUMNS", "200")  # a wide output: each row's cells on one line (100 wraps them)
    code, out, _ = invoke(capsys, "types", "--gpu", "B200")
    assert code == 0 and "cuda" in out and "12.9 13.0" in out


@pytest.mark.parametrize("asked", ["12.9", "13", "13.x"])
def test_up_refuses_a_line_not_installed_yet(capsys, gpuprov_home: Path, tmp_path: Path, asked: str) -> None:
    line = "12.9" if asked == "12.9" else "13.0"
    before = state_of(gpuprov_home)
    for args in (["up", "--provider", "static", "--hosts", hosts_file(tmp_path), "--name", "c13", "--cuda", asked],
                 ["up", "--type", "p6-b200.48xlarge", "--count", "1", "--name", "b200", "--cuda", asked, "--yes"],
                 ["up", "--provider", "docker", "--count", "1", "--cuda", asked]):
        code, out, err = invoke(capsys, *args)
        one_line_exit_2(code, out, err, f"CUDA {line} resolves (`gpuprov stack --type ")
        assert "does not install it yet: up, provision and patch install CUDA 11.8" in err
        assert state_of(gpuprov_home) == before


def test_up_still_takes_the_installed_line_in_any_spelling(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    # The refusal is for lines not installed: `--cuda 11` is 11.8 and goes on to the plan.
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", hosts_file(tmp_path), "--name", "c11",
                            "--cuda", "11", "--dry-run")
    assert code == 0, err
    assert "CUDA 11.8" in out + err and Store().list_clusters() == []


