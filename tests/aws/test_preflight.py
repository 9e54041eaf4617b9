"""Plan and preflight on EC2: bad input is one line, exit 2, and zero mutating API calls.

The shim's call log is the witness that nothing was created.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from gpuprov.state import Store
from tests.aws.helpers import CIDR, assert_refused, invoke, up
from tests.aws.moto_shim import Fault, Shim

DEBIAN = "/aws/service/debian/release/12/latest/amd64"  # the default --os (tests/aws/test_default_image.py)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--type", "p4d.24xl"], "did you mean p4d.24xlarge"),
        (["--type", "p4d.24xlarge", "--region", "af-south-1"], "not offered in region af-south-1"),
        (["--type", "p4d.24xlarge", "--region", "us-est-1"], "unknown AWS region 'us-est-1'"),
        (["--type", "p4d.24xlarge", "--ssh-cidr", "0.0.0.0/0"], "whole internet"),
        (["--type", "p4d.24xlarge", "--ssh-cidr", "::/0"], "whole internet"),
        (["--type", "p4d.24xlarge", "--ssh-cidr", "my-laptop"], "not an address range"),
        (["--type", "p4d.24xlarge", "--image", "ami-00000000000000000"], "--image ami-00000000000000000"),
        (["--type", "p4d.24xlarge", "--count", "0"], "0 is not in the range"),
        (["--type", "p4d.24xlarge", "--disk-gb", "4"], "4 is not in the range"),
        (["--type", "p4d.24xlarge", "--disk-gb", "30"], "'--disk-gb': 30 is not in the range 40<=x<=16384"),
        (["--type", "p4d.24xlarge", "--capacity-reservation", "r-1"], "expected an id like cr-"),
    ],
)
def test_bad_input_creates_nothing(capsys, shim: Shim, ami: str, args: list[str], needle: str) -> None:
    base = ["up", "--name", "bad", "--count", "2", "--image", ami, "--ssh-cidr", CIDR, "--yes"]
    code, out, err = invoke(capsys, *base, *args)
    assert_refused(code, out, err, needle, shim)


def test_count_above_the_vcpu_quota(capsys, shim: Shim, ami: str) -> None:
    shim.quotas["L-417A185B"] = 192
    code, out, err = invoke(capsys, "up", "--name", "big", "--type", "p4d.24xlarge", "--count", "4",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "needs 384 vCPUs but the quota 'Running On-Demand P instances' "
                   "(L-417A185B) in us-east-1 is 192", shim)


def test_no_credentials(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    code, out, err = invoke(capsys, "up", "--name", "nocreds", "--type", "p4d.24xlarge", "--count", "1",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "no AWS credentials found", shim)
    assert shim.calls == []


def test_address_not_detectable_asks_for_ssh_cidr(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_IP_ECHO_URL", "http://127.0.0.1:9/")
    code, out, err = invoke(capsys, "up", "--name", "noip", "--type", "g5.xlarge", "--count", "1",
                            "--image", ami, "--yes")
    assert_refused(code, out, err, "pass --ssh-cidr", shim)


def test_detected_address_becomes_a_slash_32(capsys, shim: Shim, ami: str, monkeypatch) -> None:
    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"198.51.100.23\n")

        def log_message(self, *args) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GPUPROV_IP_ECHO_URL", f"http://127.0.0.1:{server.server_port}/")
    try:
        code, _, err = invoke(capsys, "up", "--name", "myip", "--type", "g5.xlarge", "--count", "1",
                              "--image", ami, "--dry-run")
    finally:
        server.shutdown()
    assert code == 0, err
    assert "SSH allowed from 198.51.100.23/32 only" in err


def test_cost_estimate_is_shown_before_the_prompt_and_no_means_nothing(capsys, shim: Shim, ami: str,
                                                                       monkeypatch) -> None:
    import click

    from gpuprov.cli import app as cli

    asked = []
    monkeypatch.setattr(cli, "_interactive", lambda: True)
    monkeypatch.setattr(click, "confirm", lambda text, **kw: asked.append(text) or False)
    code, _, err = invoke(capsys, "up", "--name", "pricey", "--type", "p4d.24xlarge", "--count", "4",
                            "--image", ami, "--ssh-cidr", CIDR)
    assert code == 1 and "aborted; nothing was created" in err
    assert asked == ["Launch 4 x p4d.24xlarge?"]
    # p4d.24xlarge after AWS's June 2025 cut: 21.957642 x 4 = 87.83/hour (docs/cost.md).
    assert ("cost: $87.83/hour, $2,107.93/day for 4 node(s) at $21.96/node/hour (on-demand in us-east-1, "
            "bundled table as of 2026-08-26; list price: an estimate, not a quote)") in err
    assert shim.mutating() == []


def test_quota_api_unavailable_warns_and_goes_on(capsys, shim: Shim, ami: str) -> None:
    code, _, err = up(capsys, ami, "noquota", count=1, itype="g5.xlarge")
    assert code == 0, err
    assert "warning: could not read the vCPU quota 'Running On-Demand G and VT instances' (L-DB2E81BA)" in err


def test_dry_run_asks_ec2_for_every_mutating_call_and_creates_nothing(capsys, shim: Shim, ami: str) -> None:
    code, out, err = invoke(capsys, "up", "--name", "dry", "--type", "p4d.24xlarge", "--count", "2",
                            "--image", ami, "--ssh-cidr", CIDR, "--dry-run", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["dry_run"] is True
    assert shim.mutating() == []
    asked = {c.action for c in shim.calls if c.dry_run}
    assert {"RunInstances", "ImportKeyPair", "CreateSecurityGroup", "AuthorizeSecurityGroupIngress",
            "CreatePlacementGroup", "TerminateInstances", "DeleteSecurityGroup", "DeleteKeyPair",
            "AllocateAddress"} <= asked
    assert "dry run: ec2:RunInstances allowed" in err
    assert Store().list_clusters() == []


def test_dry_run_names_a_refused_permission(capsys, shim: Shim, ami: str) -> None:
    shim.faults.append(Fault("RunInstances", "UnauthorizedOperation",
                             "You are not authorized to perform this operation.", dry_run=True))
    code, _, err = invoke(capsys, "up", "--name", "dry", "--type", "g5.xlarge", "--count", "1",
                          "--image", ami, "--ssh-cidr", CIDR, "--dry-run")
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "gpuprov: AWS refuses ec2:RunInstances for these credentials; see docs/aws-iam-policy.json "
        "for what gpuprov needs")
    assert shim.mutating() == []


def test_image_from_the_public_ssm_parameter(capsys, shim: Shim, ami: str) -> None:
    shim.ssm_parameters[DEBIAN] = ami
    code, _, err = invoke(capsys, "up", "--name", "ssm", "--type", "g5.xlarge", "--count", "1",
                          "--ssh-cidr", CIDR, "--dry-run")
    assert code == 0, err
    assert f"image {ami}: Debian 12 (bookworm)" in err


def test_no_image_anywhere_asks_for_image(capsys, shim: Shim) -> None:
    code, out, err = invoke(capsys, "up", "--name", "noimg", "--type", "g5.xlarge", "--count", "1",
                            "--ssh-cidr", CIDR, "--yes")
    assert_refused(code, out, err, "pass --image ami-", shim)
    assert [c.action for c in shim.calls if c.service == "ssm"] == ["GetParameter"]


def test_types_refresh_caches_ec2_facts(capsys, shim: Shim, gpuprov_home) -> None:
    code, _, err = invoke(capsys, "types", "--refresh", "--region", "us-east-1", "--gpu", "H100", "-o", "json")
    assert code == 0, err
    assert (gpuprov_home / "catalog" / "ec2-us-east-1.json").is_file()
    from gpuprov import catalog

    p5 = catalog.get("p5.48xlarge", region="us-east-1")
    assert (p5.gpu_model, p5.gpu_count, p5.efa_max_interfaces, p5.arch, p5.nvswitch) == ("H100", 8, 32, "sm_90", True)
