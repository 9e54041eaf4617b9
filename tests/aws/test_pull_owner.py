"""Pull mode's S3 buckets are this account's or not used (issue 54, item 6): every bucket and
object call gpuprov makes passes ExpectedBucketOwner (the credentials' account, from STS, asked
once a command), the nodes' presigned GET signs it as a header the agent sends, and the IAM
policies in docs/ allow S3 actions only where s3:ResourceAccount is the caller's account.

moto takes ExpectedBucketOwner and checks nothing (every bucket is its one account's), so a
wrong owner would pass there and a test through moto alone would mean nothing. Two checks
instead: botocore's own events record the parameter on every call as it is sent, and the
signature-checking front (tests/aws/s3_front.py) refuses, as S3 does (403 AccessDenied), a
request whose expected owner is not the bucket's, a bucket standing for one that another
account claimed through ``Front.owners``. What S3 cannot check: a presigned POST upload has no
owner field, so a node's report POST reaches a claimed bucket (said here and in
docs/security.md); the policy's s3:ResourceAccount condition is what refuses it."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.pull import Boot
from tests.aws import iam
from tests.aws.conftest import REGION, ROOT_POLICY
from tests.aws.s3_front import Front
from tests.unit.node_programs import load_agent

OTHER = "210987654321"  # the account that claimed a bucket name
NAMED_POLICY = ROOT_POLICY.with_name("aws-iam-policy-pull-bucket.json")
STATE_POLICY = ROOT_POLICY.with_name("aws-iam-policy-state.json")  # the S3 state's (issue 57)
HEADER = "x-amz-expected-bucket-owner"


def _s3() -> Any:
    import boto3

    return boto3.client("s3", region_name=REGION)


def _recorded(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[tuple[str, dict[str, str]]], list[str]]:
    """One Aws for every call (api.connect gives it), with each S3 operation's name and headers
    as botocore sends them, and each STS operation."""
    from gpuprov.providers.aws import api
    from gpuprov.providers.aws import s3 as s3mod

    aws = api.connect(REGION)
    made: list[tuple[str, dict[str, str]]] = []
    sts: list[str] = []
    s3mod.client(aws).meta.events.register("before-call.s3", lambda model, params, **_: made.append(
        (model.name, {k.lower(): v for k, v in params["headers"].items()})))
    aws.client("sts").meta.events.register("before-call.sts", lambda model, **_: sts.append(model.name))
    monkeypatch.setattr(api, "connect", lambda *a, **k: aws)
    return aws, made, sts


def test_every_bucket_and_object_call_expects_this_account(front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.providers.aws import s3, s3_named, teardown

    _s3().create_bucket(Bucket="team-named")
    aws, made, sts = _recorded(monkeypatch)
    front.unowned.clear()
    channel = s3.open_channel("pl", REGION, lambda _: None)
    sha = hashlib.sha256(b"x").hexdigest()
    channel.publish(b"x", sha)
    config = Boot(bundle_url="", report_url="", sha256=sha, key=b"k" * 32, channel=channel).node_config("pl-1", "")
    agent = load_agent("gpuprov_pull_agent_owner")
    assert urllib.request.urlopen(agent.request(config, config["bundle_url"])).read() == b"x"
    agent.put_object(config, b'{"from": 0, "events": []}', 1)
    channel.read_object(next(iter(channel.list_reports())))
    channel.remove_reports(["pl-1"])
    named = s3_named.open_channel("pb", "team-named", REGION, lambda _: None)
    named.publish(b"x", sha)
    s3_named.delete_prefixes(aws, "pb", ["team-named"], lambda _: None)
    teardown.delete_cluster_resources(aws, "pl", lambda _: None)
    # Each call as sent: this account's id, but ListBuckets (the caller's own) and CreateBucket
    # (a name another account holds is refused: BucketAlreadyExists), which take none.
    names = {name for name, _ in made}
    assert {"ListObjectsV2", "PutObject", "GetObject", "DeleteObjects", "PutBucketPolicy", "GetBucketLocation",
            "GetBucketPolicy", "GetPublicAccessBlock", "DeleteBucket", "GetBucketTagging"} <= names, names
    wrong = [(n, h.get(HEADER)) for n, h in made if n not in ("ListBuckets", "CreateBucket") and h.get(HEADER)
             != iam.ACCOUNT]
    assert not wrong, wrong
    assert sts == ["GetCallerIdentity"]  # once for the whole run
    # The node's GET signed the owner (the agent sends it); at the front, only ListBuckets,
    # CreateBucket and the node's POST upload (S3's POST has no owner field) came without one.
    assert HEADER in config["bundle_url"].split("X-Amz-SignedHeaders=")[1].split("&")[0]
    assert config["bundle_headers"] == {HEADER: iam.ACCOUNT}
    assert {u.split(" ")[0] for u in front.unowned} == {"GET", "PUT", "POST"}, front.unowned
    assert sorted(u for u in front.unowned if not u.startswith("GET")) == [f"POST /{channel.bucket}",
                                                                            f"PUT /{channel.bucket}"]


def test_a_bucket_another_account_owns_is_refused_not_used(front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.exceptions import ClientError

    from gpuprov.providers.aws import s3, s3_named

    _s3().create_bucket(Bucket="team-claimed")
    front.owners["team-claimed"] = OTHER
    aws, _, _ = _recorded(monkeypatch)
    with pytest.raises(GpuprovError) as stopped:
        s3_named.open_channel("pb", "team-claimed", REGION, lambda _: None)
    assert f"or the bucket is not this account's ({iam.ACCOUNT}: gpuprov uses no other's)" in str(stopped.value)
    said: list[str] = []
    s3_named.delete_prefixes(aws, "pb", ["team-claimed"], said.append)  # `down`: said, nothing deleted
    assert said == ["S3 bucket team-claimed: objects under gpuprov/pb/ not deleted (AccessDenied)"]
    # The cluster's own bucket, its name claimed by another account after the URLs went out:
    # the controller's calls and the node's GET are refused; nothing is written by gpuprov.
    channel = s3.open_channel("pl", REGION, lambda _: None)
    sha = hashlib.sha256(b"x").hexdigest()
    channel.publish(b"x", sha)
    config = Boot(bundle_url="", report_url="", sha256=sha, key=b"k" * 32, channel=channel).node_config("pl-1", "")
    front.owners[channel.bucket] = OTHER
    for call in (lambda: channel.publish(b"y", hashlib.sha256(b"y").hexdigest()), channel.list_reports,
                 lambda: channel.read_object(channel.bundle_key(sha))):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.response["Error"]["Code"] == "AccessDenied"
    agent = load_agent("gpuprov_pull_agent_claimed")
    with pytest.raises(urllib.error.HTTPError) as node_refused:
        urllib.request.urlopen(agent.request(config, config["bundle_url"]))
    assert node_refused.value.code == 403 and front.refused[-1] == f"AccessDenied: the bucket's owner is not {iam.ACCOUNT}"
    # What S3 cannot refuse: the node's POST carries no owner. The documented policy does.
    agent.put_object(config, b'{"from": 0, "events": []}', 1)
    policy = json.loads(ROOT_POLICY.read_text())
    resource = f"arn:aws:s3:::{channel.bucket}/{channel.report_prefix('pl-1')}00000001-x.json"
    assert not iam.allowed_by(policy, iam.Authorization("s3:PutObject", resource, iam.s3_context(OTHER)))
    assert iam.allowed_by(policy, iam.Authorization("s3:PutObject", resource, iam.s3_context()))


@pytest.mark.parametrize("doc", [ROOT_POLICY, NAMED_POLICY, STATE_POLICY], ids=lambda p: p.name)
def test_the_documented_policies_allow_s3_on_this_accounts_buckets_only(doc: Any) -> None:
    """Each S3 statement (but ListAllMyBuckets, on "*", and CreateBucket) allows its actions on
    its resources in a bucket of the caller's account, and none in one another account owns,
    nor where the request says no owner at all."""
    policy = json.loads(doc.read_text().replace("BUCKET", "team-bucket"))
    checked = 0
    for statement in policy["Statement"]:
        for action in iam._as_list(statement["Action"]):
            if not action.startswith("s3:") or action in ("s3:ListAllMyBuckets", "s3:CreateBucket"):
                continue
            for resource in iam._as_list(statement["Resource"]):
                arn = resource.replace("*", "x")
                prefix = {"s3:prefix": "gpuprov/c/"}
                assert iam.allowed_by(policy, iam.Authorization(action, arn, {**prefix, **iam.s3_context()})), action
                assert not iam.allowed_by(policy, iam.Authorization(action, arn, {**prefix, **iam.s3_context(OTHER)}))
                assert not iam.allowed_by(policy, iam.Authorization(action, arn, prefix)), action
                checked += 1
    assert checked >= 7
