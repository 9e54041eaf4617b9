"""`--health` on `up` and `patch`: a level that is not built, or not a level, is one line and
exit 2, checked before anything else (no provider asked, no cluster recorded, no run);
`--help` shows the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.state import Store
from tests.conftest import invoke

ONE_OF = "--health full: one of off, quick, standard"


def _nothing_made(home: Path) -> None:
    assert Store().list_clusters() == []
    assert not any(p.is_file() for p in home.rglob("*")), sorted(home.rglob("*"))  # not even a state.db


@pytest.mark.parametrize(("level", "needle"), [
    ("full", ONE_OF),
    ("fast", "--health fast: one of off, quick, standard"),
])
def test_up_refuses_a_level_before_asking_the_provider(capsys, gpuprov_home: Path, monkeypatch,
                                                        level: str, needle: str) -> None:
    # No engine answers here: were the provider asked first, the error would say so.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "h1",
                            "--health", level)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Docker" not in err, err
    _nothing_made(gpuprov_home)


def test_up_refuses_a_level_with_a_dry_run_too(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  - name: a\n    address: 192.0.2.1\n")
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts), "--dry-run",
                            "--health", "full")
    assert code == 2 and out == "" and ONE_OF in err and len(err.strip().splitlines()) == 1
    _nothing_made(gpuprov_home)


@pytest.mark.parametrize(("level", "needle"), [
    ("full", ONE_OF),
    ("Standard", "--health Standard: one of off, quick, standard"),
])
def test_patch_refuses_a_level_and_records_no_run(capsys, gpuprov_home: Path, level: str, needle: str) -> None:
    Store().create_cluster("rack3", "static", {})
    code, out, err = invoke(capsys, "patch", "rack3", "--kernel", "--health", level)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert Store().runs("rack3") == []


@pytest.mark.parametrize("command", ["up", "patch"])
def test_help_shows_the_health_flag(capsys, command: str) -> None:
    code, out, _ = invoke(capsys, command, "--help")
    assert code == 0 and "--health" in out and "quick" in out


def test_up_exits_1_naming_each_failing_check_when_health_fails(capsys, gpuprov_home: Path, monkeypatch) -> None:
    """The command line's half (core.up stands in, returning a bootstrap that went through and
    a failing check): exit 1, the table shows the failing row with its action, JSON carries it."""
    import json

    from gpuprov.core import up as up_command
    from gpuprov.results.shapes import Bootstrap, HealthCheck, HealthResult, UpResult, VerifySummary

    ecc = HealthCheck(node="h1-node-1", check="ecc", status="fail", found="GPU 2: 4 uncorrectable (DRAM)",
                      expected="0 uncorrectable volatile ECC errors", action="drain the node and reset the GPU")
    ok_row = HealthCheck(node="h1-node-1", check="gpu_count", status="pass", found="8 NVIDIA GPU(s)",
                         expected="8 x H100", action="")
    seen: dict[str, str] = {}

    def up(request, **_):
        spec, health = request.spec, request.health
        seen["health"] = health
        checked = HealthResult(cluster=spec.name, level=health, ok=health == "off", started="t0", finished="t1",
                               checks=[ok_row, ecc], summary=VerifySummary(pass_=1, fail=1, skip=0))
        return UpResult(cluster=spec.name, provider="docker", nodes=[], bootstrap=Bootstrap(ok=True, hosts={}, errors={}),
                        health=None if health == "off" else checked)

    monkeypatch.setattr(up_command, "up", up)
    code, out, _ = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "h1")
    assert (code, seen["health"]) == (1, "quick")
    assert "health h1 (quick): 1 pass, 1 fail, 0 skip" in out
    assert "drain the node and reset the GPU" in out and "gpu_count" not in out  # failing rows only
    code, out, _ = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "h1", "-o", "json")
    assert code == 1 and json.loads(out)["health"]["checks"][1]["action"] == ecc.action
    code, out, _ = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--name", "h1", "--health", "off",
                          "-o", "json")
    assert (code, seen["health"]) == (0, "off") and "health" not in json.loads(out)
