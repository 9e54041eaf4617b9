"""AWS configuration errors are input errors: one line naming the problem, exit 2, nothing created.

A profile that is not there (AWS_PROFILE), a config or credentials file that does not parse,
and an unknown region in the profile are found before any API call: the shim's call log stays
empty, and no cluster is recorded. Through the real command line, in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.state import Store
from tests.aws.helpers import CIDR
from tests.aws.moto_shim import Shim
from tests.conftest import run_cli


def _refused(proc, shim: Shim, *needles: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: "), proc.stderr
    assert "internal error" not in lines[0] and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert shim.calls == [], [c.action for c in shim.calls]
    assert Store().list_clusters() == []
    return lines[0]


def _up(name: str, ami: str = "ami-03cf127a"):
    return run_cli("up", "--name", name, "--type", "g5.xlarge", "--count", "1", "--image", ami,
                   "--ssh-cidr", CIDR, "--yes", timeout=120)


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "aws-config"
    path.write_text("[default]\nregion = us-east-1\n\n[profile dev]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(path))
    return path


def test_missing_profile_is_one_line_naming_it(shim: Shim, config_file: Path, monkeypatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "nosuchprofile")
    line = _refused(_up("noprofile"), shim, "AWS profile 'nosuchprofile' (from AWS_PROFILE)",
                    str(config_file), "profiles there: default, dev")
    assert "ProfileNotFound" not in line
    # down of a cluster gpuprov does not know asks AWS for its tags: the same line, never
    # "nothing to remove" from a profile it could not read.
    _refused(run_cli("down", "noprofile", "--yes", timeout=120), shim,
             "AWS profile 'nosuchprofile' (from AWS_PROFILE)")


def test_malformed_config_file_names_the_file_and_line(shim: Shim, config_file: Path) -> None:
    config_file.write_text("[default]\nregion = us-east-1\nthis line is not ini\n")
    _refused(_up("badconfig"), shim, f"AWS config file {config_file} does not parse", "line 3")


def test_malformed_credentials_file_never_quotes_it(shim: Shim, tmp_path: Path, monkeypatch) -> None:
    creds = tmp_path / "aws-credentials"
    creds.write_text("aws_secret_access_key = notasecretbutquoted\n[default]\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    line = _refused(_up("badcreds"), shim, f"AWS credentials file {creds} does not parse",
                    "line 1 comes before any [section] line")
    assert "notasecretbutquoted" not in line


def test_unknown_region_in_the_profile_names_profile_and_file(shim: Shim, config_file: Path,
                                                              monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    config_file.write_text("[profile dev]\nregion = us-est-1\n")
    monkeypatch.setenv("AWS_PROFILE", "dev")
    _refused(_up("badregion"), shim,
             f"unknown AWS region 'us-est-1' (from profile 'dev' in {config_file})", "did you mean")
