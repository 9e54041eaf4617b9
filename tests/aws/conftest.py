"""Fixtures for the aws provider: moto's real server behind the test shim.

The product reaches them only through the standard AWS_ENDPOINT_URL and fake
credentials, as it would reach AWS. One moto server serves the session; its
state is reset before every test.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.providers.aws import api
from tests.aws import moto_shim
from tests.aws.s3_front import Front
from tests.suite_strategy import SUITE_STRATEGY

REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


@pytest.fixture(scope="session")
def _shim_server(moto_server: str) -> Iterator[moto_shim.Shim]:
    shim, server = moto_shim.start(moto_server)
    yield shim
    shim.release.set()
    server.shutdown()


@pytest.fixture
def shim(_shim_server: moto_shim.Shim, moto_server: str, gpuprov_home: Path,
         monkeypatch: pytest.MonkeyPatch) -> Iterator[moto_shim.Shim]:
    """A fresh moto behind the shim, reached the standard way; an isolated GPUPROV_HOME."""
    urllib.request.urlopen(urllib.request.Request(f"http://{moto_server}/moto-api/reset", method="POST")).read()
    _shim_server.reset()
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", _shim_server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(gpuprov_home.parent / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(gpuprov_home.parent / "no-aws-credentials"))
    monkeypatch.setenv("GPUPROV_AWS_MAX_ATTEMPTS", "4")
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "3")
    monkeypatch.setenv("GPUPROV_AWS_BACKOFF_S", "0.05")
    monkeypatch.setenv("GPUPROV_ANSIBLE_STRATEGY", SUITE_STRATEGY)  # tests/suite_strategy.py says why
    yield _shim_server
    _shim_server.release.set()


# One of the images moto bundles (it has none of Canonical's). Listing them all
# takes seconds after every reset; asking for one by id does not.
MOTO_AMI = "ami-03cf127a"


@pytest.fixture
def ami(shim: moto_shim.Shim) -> str:
    """An image moto knows, checked to exist."""
    import boto3

    (image,) = boto3.client("ec2", region_name=REGION).describe_images(ImageIds=[MOTO_AMI])["Images"]
    shim.calls.clear()
    return str(image["ImageId"])


@pytest.fixture
def ec2(shim: moto_shim.Shim, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Instances that are real nodes (tests/aws/ec2_nodes.py): each one RunInstances starts boots
    a systemd node container with cloud-init; all of them removed on the way out."""
    import os

    from tests.aws import ec2_nodes
    from tests.conftest import require_docker

    require_docker()
    proxy = os.environ.get("GPUPROV_APT_PROXY")
    if not proxy:
        raise AssertionError("GPUPROV_APT_PROXY is not set: run through `make test`")
    nodes = ec2_nodes.Ec2Nodes(apt_proxy=proxy)
    shim.nodes = nodes
    # Real boots: SSH comes up in seconds, not the shim's default 3 s.
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "300")
    # These instances are containers on this machine's disk, whatever it has free that minute,
    # not 200 GiB volumes: their clusters record the local nodes' floor (a cluster setting, as a
    # site whose images leave less room sets it), not a real node's 40 GiB.
    from gpuprov import defaults

    monkeypatch.setenv("GPUPROV_ROOT_FREE_GIB", str(defaults.LOCAL_NODE_FREE_GIB))
    try:
        yield nodes
    finally:
        shim.nodes = None
        nodes.close()


def instances(name: str, states: tuple[str, ...] = ("pending", "running")) -> list[dict]:
    """What EC2 (moto, straight, not through the product) says carries the cluster's tag."""
    import boto3

    ec2 = boto3.client("ec2", region_name=REGION)
    found = ec2.describe_instances(Filters=[
        {"Name": "tag:gpuprov:cluster", "Values": [name]},
        {"Name": "instance-state-name", "Values": list(states)},
    ])["Reservations"]
    return [i for r in found for i in r["Instances"]]


def dump(data: object) -> str:
    return json.dumps(data, indent=1, default=str)


ROOT_POLICY = Path(__file__).resolve().parents[2] / "docs" / "aws-iam-policy.json"


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An Aws whose ssm and ec2 clients are real botocore clients with a Stubber each."""
    import boto3
    from botocore.stub import Stubber

    for var in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                    region_name=REGION)
    aws = api.Aws(region=REGION, session=session)
    stubs = {name: Stubber(aws.client(name)) for name in ("ssm", "ec2")}
    for stub in stubs.values():
        stub.activate()
    yield aws, stubs
    for stub in stubs.values():
        stub.assert_no_pending_responses()
        stub.deactivate()


@pytest.fixture
def front(shim: moto_shim.Shim, moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Front]:
    """moto's S3 behind the signature-checking front (tests/aws/s3_front.py, a FIXTURE), reached
    the standard way (AWS_ENDPOINT_URL_S3)."""
    s3front = Front(moto_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3front.url)
    yield s3front
    s3front.close()
