"""The power service's zipapp (gpuprov.slurm.power_aws_bundle): the same bytes for the same
source, every gpuprov module the service imports in it and nothing else, and the service runs
from it alone (``python -I -S``: no site-packages, so no gpuprov but the zipapp's), its
configuration checked before any value is used."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from gpuprov.slurm import power_aws_bundle
from tests.conftest import ROOT

GOOD = {"cluster": "train", "region": "us-east-1", "launch_template": "lt-0123456789abcdef0",
        "image": "ami-0123456789abcdef0", "instance_type": "p4d.24xlarge",
        "subnets": [["us-east-1a", "subnet-0123456789abcdef0"]], "count": 2, "port": 0,
        "key_file": "/etc/slurm/gpuprov-power.key", "rests": "/var/lib/gpuprov/power-rests.json"}


def test_the_bundle_is_the_same_bytes_and_rewritten_only_when_they_differ(tmp_path: Path) -> None:
    assert power_aws_bundle.build() == power_aws_bundle.build()
    path = power_aws_bundle.write(tmp_path)
    assert path.name == "power-aws.pyz" and path.read_bytes() == power_aws_bundle.build()
    mtime = path.stat().st_mtime_ns
    assert power_aws_bundle.write(tmp_path).stat().st_mtime_ns == mtime


def test_it_holds_exactly_the_modules_the_service_imports() -> None:
    """What `import gpuprov.slurm.power_aws_node` loads, in a fresh interpreter on the source."""
    probe = ("import sys, os; sys.path.insert(0, sys.argv[1]); import gpuprov.slurm.power_aws_node; "
             "print('\\n'.join(sorted(os.path.relpath(m.__file__, os.path.join(sys.argv[1], 'gpuprov')) "
             "for n, m in sys.modules.items() if n.split('.')[0] == 'gpuprov')))")
    loaded = subprocess.run([sys.executable, "-I", "-c", probe, str(ROOT)], capture_output=True, text=True,
                            check=True, timeout=60).stdout.split()
    assert sorted(power_aws_bundle.FILES) == loaded


def _run(pyz: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-S", str(pyz), *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_it_runs_from_the_zipapp_alone_and_checks_its_configuration(tmp_path: Path) -> None:
    pyz = power_aws_bundle.write(tmp_path)
    with zipfile.ZipFile(pyz) as zf:
        assert zf.read("__main__.py") == power_aws_bundle.MAIN
    config = tmp_path / "power-aws.json"
    config.write_text(json.dumps(GOOD))
    done = _run(pyz, "--check", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"{config}: the power service of train (us-east-1, 2 dynamic node(s)): "
                           "configuration checked\n")
    config.write_text(json.dumps({**GOOD, "image": "ami-1\nState=DOWN"}))
    refused = _run(pyz, "--check", str(config))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == f"gpuprov power service: {config}: image: 'ami-1?State=DOWN' is not one\n", refused.stderr
    missing = _run(pyz, str(tmp_path / "absent.json"))
    assert missing.returncode == 1 and "absent.json: FileNotFoundError" in missing.stderr


def test_the_play_vars_give_the_role_a_configuration_the_service_takes(tmp_path: Path) -> None:
    """What gpuprov hands the slurm role for an elastic AWS controller, with what the role adds
    (the key's and the rests' paths on the node, roles/slurm/tasks/power_aws.yml), is what the
    service's own --check takes, as the role's validate runs it."""
    import re

    import yaml

    from gpuprov.providers.aws import power, power_setup

    plan = power.Plan("train", "lt-0123456789abcdef0", "ami-0123456789abcdef0", "p4d.24xlarge",
                      {"us-east-1b": "subnet-0123456789abcdef0", "us-east-1a": "subnet-0123456789abcdef1"})
    made = power_setup.Made("lt-0123456789abcdef0", "gpuprov-train-us-east-1-power", "gpuprov-train-us-east-1-power")
    got = power_aws_bundle.play_vars(tmp_path, made, plan, region="us-east-1", count=3, controller_addr="10.0.1.9",
                                     key_src=str(tmp_path / "power.key"))
    aws = got["aws"]
    assert Path(aws["pyz_src"]).read_bytes() == power_aws_bundle.build()
    assert aws["config"]["subnets"] == [["us-east-1b", "subnet-0123456789abcdef0"],
                                        ["us-east-1a", "subnet-0123456789abcdef1"]]  # the zones' order kept
    role_vars = yaml.safe_load((ROOT / "roles" / "slurm" / "vars" / "main.yml").read_text())
    config = tmp_path / "power-aws.json"
    config.write_text(json.dumps({**aws["config"], "key_file": role_vars["__slurm_power_key"],
                                  "rests": role_vars["__slurm_power_aws_rests"]}))
    done = _run(Path(aws["pyz_src"]), "--check", str(config))
    assert done.returncode == 0, done.stderr
    assert re.match(rf"^http://127\.0\.0\.1:{aws['config']['port']}/", got["url"])  # the role's assert
