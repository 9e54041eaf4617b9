"""`gpuprov types`: the region's prices with their date and source, filters, sorts, --for, a
budget no type meets (exit 2), and start-up without boto3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.cli.app import main


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def rows(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    code, out, err = invoke(capsys, "types", "-o", "json", *args)
    assert code == 0, err
    return list(json.loads(out))


def by_name(found: list[dict]) -> dict[str, dict]:
    return {r["instance_type"]: r for r in found}


def test_region_shows_that_regions_prices(capsys, gpuprov_home: Path, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    eu = by_name(rows(capsys, "--region", "eu-west-1"))
    assert eu["p3.2xlarge"]["price"] == {"usd_per_hour": 3.305, "kind": "on-demand", "region": "eu-west-1",
                                         "zone": None, "source": "bundled table", "as_of": "2026-08-26"}
    assert eu["p5.48xlarge"]["price"] is None and eu["p5.48xlarge"]["price_per_gpu_hour"] is None
    us = by_name(rows(capsys))  # no --region, no AWS_DEFAULT_REGION: us-east-1
    assert us["p3.2xlarge"]["price"]["usd_per_hour"] == 3.06 and us["p3.2xlarge"]["price"]["region"] == "us-east-1"
    assert us["p5.48xlarge"]["price_per_gpu_hour"] == 6.88
    code, out, _ = invoke(capsys, "types", "--region", "eu-west-1")
    assert code == 0 and "on-demand prices in eu-west-1" in out and "bundled table as of 2026-08-26" in out
    assert "-: no on-demand price confirmed for eu-west-1" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["--region", "eu-wst-1"], "unknown AWS region 'eu-wst-1'; did you mean eu-west-1"),
    (["--gpus", "0"], "0 is not in the range 1<=x<=64"),
    (["--max-price", "-1"], "--max-price -1: expected US dollars per instance-hour, more than 0"),
    (["--max-price", "nan"], "--max-price nan: expected US dollars"),
    (["--max-price", "inf"], "--max-price inf: expected US dollars"),
    (["--max-price", "1e9"], "and at most 1,000"),
    (["--cuda", "10.2"], "CUDA lines"),
    (["--for", "training", "--sort", "price"], "--sort and --for training both order the list"),
    (["--gpu", "Z9000"], "no instance type with GPU 'Z9000'"),
    (["--max-price", "0.3", "--gpus", "8"], "no instance type that meets the other filters costs at most $0.30/h "
     "on-demand in us-east-1; the cheapest is g5.48xlarge at $16.29/h"),
])
def test_bad_input_is_one_line_exit_2(capsys, gpuprov_home: Path, monkeypatch, args: list[str], needle: str) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    code, out, err = invoke(capsys, "types", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err
    assert not (gpuprov_home / "pricing").exists()


def test_for_training_under_a_budget_says_why(capsys, gpuprov_home: Path, monkeypatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    found = rows(capsys, "--for", "training", "--max-price", "40")
    assert [r["instance_type"] for r in found][:2] == ["p4d.24xlarge", "p4de.24xlarge"]
    assert {r["price"]["region"] for r in found} == {"us-west-2"}
    assert found[0]["why"] == ["training: NVSwitch and EFA first, then $/GPU-hour", "NVSwitch: all-to-all NVLink",
                               "EFA x4", "$21.96/h <= $40.00"]
    assert all(r["price"]["usd_per_hour"] <= 40 for r in found)
    code, out, _ = invoke(capsys, "types", "--for", "training", "--max-price", "40")
    assert code == 0 and "why" in out and "left out, no on-demand price known in us-west-2: p5e.48xlarge" in out


def test_filters_compose(capsys, gpuprov_home: Path, monkeypatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    found = rows(capsys, "--gpus", "4", "--min-gpu-mem", "24", "--efa", "--sort", "price")
    assert [r["instance_type"] for r in found][:3] == ["g5.12xlarge", "g5.48xlarge", "p4d.24xlarge"]
    assert all(r["gpus"] >= 4 and r["gpu_memory_gib"] >= 24 and r["efa"] for r in found)
    assert "p3.8xlarge" not in by_name(rows(capsys, "--cuda", "13.0"))


@pytest.mark.parametrize("output", ["table", "json"])
def test_spot_without_a_fetch_says_why_there_is_no_price_and_how_to_get_one(capsys, no_aws: Path, output: str) -> None:
    """The bundled table carries on-demand prices only: a table of `-` under its title answered
    nothing."""
    code, out, err = invoke(capsys, "types", "--spot", "-o", output)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "no spot price known in us-east-1: the bundled table carries on-demand prices only" in err
    assert "`gpuprov types --spot --refresh --region us-east-1` reads them, with AWS credentials" in err


def test_spot_prices_fetched_before_are_listed(capsys, no_aws: Path) -> None:
    from gpuprov.pricing import prices

    prices.record_spot("us-east-1", {"p5.48xlarge": {"us-east-1a": (31.5, "2026-11-01T00:00:00Z")}})
    found = by_name(rows(capsys, "--spot", "--gpu", "H100"))
    assert found["p5.48xlarge"]["price"]["usd_per_hour"] == 31.5 and found["p5.48xlarge"]["price"]["kind"] == "spot"


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpus", "64"], "no instance type has at least 64 GPUs (--gpus 64); the closest is "),
    (["--min-gpu-mem", "1000"], "no instance type has at least 1000 GiB per GPU (--min-gpu-mem 1000); "
     "the closest is p6-b200.48xlarge (179 GiB per GPU)"),
    (["--max-price", "0.1"], "no instance type costs at most $0.10/h on-demand in us-east-1; the cheapest is "
     "g4dn.xlarge at $0.53/h"),
    (["--gpu", "H100", "--gpus", "16"], "no instance type that meets the other filters has at least 16 GPUs "
     "(--gpus 16); the closest is p5.48xlarge (8 x H100)"),
    (["--gpu", "T4", "--nvswitch"], "no instance type that meets the other filters has NVSwitch (--nvswitch); "
     "the closest is g4dn.xlarge (no NVSwitch)"),
    (["--gpu", "V100", "--cuda", "13.0"], "runs CUDA 13.0 (--cuda 13.0); the closest is p3.16xlarge (sm_70: CUDA"),
    (["--gpus", "64", "--min-gpu-mem", "1000"], "no instance type has at least 64 GPUs (--gpus 64)"),
])
def test_a_filter_nothing_meets_names_it_and_the_closest_type(capsys, no_aws: Path, args: list[str],
                                                              needle: str) -> None:
    """An empty list answered nothing, with exit 0, where --max-price named the cheapest: every
    filter now answers as --max-price does, in table and JSON alike."""
    for output in ("table", "json"):
        code, out, err = invoke(capsys, "types", "-o", output, *args)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert needle in err, err


PROBE = """import sys
from gpuprov.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')))
"""


@pytest.mark.parametrize("args", [["types"], ["types", "--region", "eu-west-1", "--for", "training"], ["list"]])
def test_types_and_list_do_not_load_boto3(tmp_path: Path, args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, check=False,
                          env={"GPUPROV_HOME": str(tmp_path / "home"), "GPUPROV_CONFIG": str(tmp_path / "none.toml"),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:]


def test_refresh_offline_falls_back_to_the_bundled_table(capsys, gpuprov_home: Path, monkeypatch) -> None:
    """No network: the endpoint refuses connections (a closed loopback port); the refresh says
    so in one warning and the bundled table answers, dated."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(gpuprov_home.parent / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(gpuprov_home.parent / "no-aws-credentials"))
    monkeypatch.setenv("GPUPROV_AWS_MAX_ATTEMPTS", "1")
    code, out, err = invoke(capsys, "types", "--refresh", "--region", "us-west-2", "--gpu", "A100")
    assert code == 0, err
    assert err.startswith("gpuprov: warning: not refreshed: cannot reach the AWS ec2 endpoint http://127.0.0.1:9"), err
    assert "bundled table as of 2026-08-26" in out and "21.96" in out
    assert not (gpuprov_home / "pricing").exists()


def test_refresh_without_credentials_says_so_and_the_table_answers(capsys, gpuprov_home: Path, monkeypatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(gpuprov_home.parent / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(gpuprov_home.parent / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, out, err = invoke(capsys, "types", "--refresh", "--region", "eu-west-1", "-o", "json")
    assert code == 0, err
    assert "warning: not refreshed: no AWS credentials found" in err
    assert by_name(json.loads(out))["p3.2xlarge"]["price"]["source"] == "bundled table"


@pytest.mark.parametrize(("args", "needle"), [
    (["--provider", "docker", "--count", "1", "--max-price", "5"], "they go with --provider aws"),
    (["--type", "p4d.24xlarge", "--count", "1", "--regions", "us-east-1"], "--regions goes with --max-price"),
    (["--type", "p4d.24xlarge", "--count", "1", "--max-price", "30", "--regions", "us-east-1,mars-1"],
     "unknown AWS region 'mars-1'"),
    (["--type", "p4d.24xlarge", "--count", "1", "--max-price", "30", "--region", "us-east-1", "--regions",
      "us-west-2"], "--region and --regions both name where to launch"),
    (["--type", "p4d.24xlarge", "--count", "1", "--max-price", "0"], "--max-price 0: expected US dollars"),
    (["--type", "dgx-h100", "--count", "1", "--max-price", "30"], "dgx-h100 is an onprem machine"),
])
def test_up_budget_bad_input_before_any_aws_call(capsys, gpuprov_home: Path, monkeypatch, args: list[str],
                                                 needle: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a call would fail otherwise: none is made
    code, out, err = invoke(capsys, "up", "--name", "budget", "--yes", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and needle in err, err
    assert not (gpuprov_home / "clusters" / "budget").exists()
