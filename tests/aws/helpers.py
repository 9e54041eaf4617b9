"""What the EC2 tests share: running the CLI in-process, `up` with the usual flags, and the
invariants every test asserts (helpers, not tests)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuprov.cli.app import main
from gpuprov.state import Store
from tests.aws.conftest import instances
from tests.aws.moto_shim import Shim

CIDR = "203.0.113.7/32"


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def up(capsys, ami: str, name: str, *extra: str, count: int = 4, itype: str | None = "p4d.24xlarge"):
    """`up` on the emulated EC2 (``itype`` None: no --type, the budget picks one)."""
    typed = ("--type", itype) if itype is not None else ()
    return invoke(capsys, "up", "--name", name, *typed, "--count", str(count), "--image", ami,
                  "--ssh-cidr", CIDR, "--no-bootstrap", "--yes", "-o", "json", *extra)


def assert_whole_cluster(name: str, count: int) -> list[dict]:
    running = instances(name)
    assert len(running) == count, [i["InstanceId"] for i in running]
    assert len({i["Placement"]["AvailabilityZone"] for i in running}) == 1
    return running


def assert_nothing_left(name: str) -> None:
    assert instances(name) == []


def assert_refused(code: int, out: str, err: str, needle: str, shim: Shim) -> None:
    """Bad input: exit 2, one line on stderr, nothing created or changed."""
    assert code == 2, (code, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: ") and needle in lines[0], err
    assert shim.mutating() == [], shim.mutating()
    assert Store().list_clusters() == []


def fixture_scontrol(tmp_path: Path) -> tuple[str, Path]:
    """FIXTURE: scontrol on PATH that logs its arguments, one JSON list a line (a controller's is
    real Slurm's, in tests/e2e/test_elastic_e2e.py): (the PATH to use, the log)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}", log
