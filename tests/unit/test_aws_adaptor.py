"""boto3's and botocore's names come through one module (issue 55, as SkyPilot's adaptors/aws.py):
gpuprov.providers.aws.api imports them, lazily; every other module asks it (`api.ClientError`,
`api.Config`), so a CLI command that never calls AWS never loads botocore."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_adaptor_imports_boto3_or_botocore() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "gpuprov").rglob("*.py"))
             if p.name != "api.py" or p.parent.name != "aws"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.match(r"\s*(from|import)\s+(boto3|botocore)\b", line)]
    assert found == []


def test_its_names_are_botocores_and_load_when_asked() -> None:
    probe = ("import sys; from gpuprov.providers.aws import api, s3; assert 'botocore' not in sys.modules; "
             "from botocore.exceptions import ClientError; from botocore.config import Config; "
             "assert api.ClientError is ClientError and api.Config is Config; print('ok')")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "ok", out.stderr
    from gpuprov.providers.aws import api

    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        api.NoSuchName  # noqa: B018
