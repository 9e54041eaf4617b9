"""Pull on AWS into a bucket named by the `pull_bucket` setting (gpuprov/providers/aws/s3_named.py),
for accounts that forbid creating buckets: against moto's real S3 server with S3's own checks of
presigned requests in front of it (tests/aws/s3_front.py), as tests/aws/test_pull_s3.py does for
the cluster's own bucket. The bucket is made here, as its owner would make it (with objects of
its own, and another cluster's): gpuprov must put its objects under gpuprov/CLUSTER/ only,
change nothing of the bucket, and `down` must take those objects and nothing else."""

from __future__ import annotations

import copy
import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuprov import paths
from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterSpec
from gpuprov.pull import Boot
from gpuprov.state import Store
from tests.aws import moto_shim
from tests.aws.conftest import REGION, ROOT_POLICY
from tests.aws.helpers import CIDR, assert_refused, invoke, up
from tests.aws.s3_front import Front
from tests.unit.node_programs import load_agent

AGENT = Path(__file__).resolve().parents[2] / "gpuprov" / "pull" / "node" / "agent.py"
NAMED_POLICY = ROOT_POLICY.with_name("aws-iam-policy-pull-bucket.json")
BUCKET = "team-artifacts.example"
OTHER_ACCOUNT = "210987654321"
ACCOUNT = "123456789012"  # moto's one account (tests/aws/iam.py)
THEIRS = {"data/keep.bin": b"the owner's own object", "gpuprov/other/bundle/x.tar.gz": b"another cluster's"}


@pytest.fixture
def bucket(front: Front) -> str:
    """The owner's bucket, as they set it: Block Public Access with one setting off, default
    encryption, no TLS-only policy; two objects that are not this cluster's."""
    s3 = _s3()
    s3.create_bucket(Bucket=BUCKET)
    s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": False})
    s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    for key, body in THEIRS.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return BUCKET


def _s3() -> Any:
    import boto3

    return boto3.client("s3", region_name=REGION)


def _config_of(name: str) -> dict[str, Any]:
    """What the owner set on the bucket, read straight from moto (and the front's policies)."""
    from botocore.exceptions import ClientError

    s3, out = _s3(), {}
    for what, call in (("tags", s3.get_bucket_tagging), ("lifecycle", s3.get_bucket_lifecycle_configuration),
                       ("block", s3.get_public_access_block), ("encryption", s3.get_bucket_encryption),
                       ("policy", s3.get_bucket_policy)):
        try:
            answer = call(Bucket=name)
            answer.pop("ResponseMetadata", None)
            out[what] = answer
        except ClientError as exc:
            out[what] = exc.response["Error"]["Code"]
    return out


def _objects(name: str) -> dict[str, bytes]:
    s3 = _s3()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=name).get("Contents", [])]
    return {k: s3.get_object(Bucket=name, Key=k)["Body"].read() for k in keys}


def _spec(name: str, value: str = BUCKET) -> ClusterSpec:
    from gpuprov.providers.aws.options import AwsOptions

    return ClusterSpec(name=name, provider="aws", instance_type="g5.xlarge", count=1, options=AwsOptions(region=REGION),
                       settings={"pull_bucket": {"value": value, "from": "test"}})


def _channel(name: str, said: list[str], bucket: str = BUCKET) -> Any:
    from gpuprov.providers.aws.provider import AwsProvider

    paths.cluster_dir(name)
    return AwsProvider().pull_channel(_spec(name, bucket), said.append)


def _agent() -> Any:
    return load_agent("gpuprov_pull_agent_bucket")


def test_objects_land_under_the_prefix_and_the_bucket_stays_as_its_owner_set_it(bucket: str, front: Front) -> None:
    from gpuprov.providers.aws import s3

    before = _config_of(bucket)
    said: list[str] = []
    channel = _channel("pb", said)
    assert channel.bucket == bucket and channel.prefix == "gpuprov/pb/"
    # What it found, said; what is missing, a warning; nothing changed.
    assert said[0].startswith(f"S3 bucket {bucket} (pull_bucket): the cluster's objects go under gpuprov/pb/")
    assert f"S3 bucket {bucket}: warning: Block Public Access is off here (RestrictPublicBuckets;" in said[1]
    assert said[2] == f"S3 bucket {bucket}: default encryption AES256"
    assert said[3].startswith(f"S3 bucket {bucket}: warning: no bucket policy statement denies requests not made "
                              "over TLS")
    data = b"bundle bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert channel.publish(data, sha) is True and channel.publish(data, sha) is False
    config = Boot(bundle_url="", report_url="", sha256=sha, key=b"k" * 32, channel=channel).node_config("pb-1", "")
    agent = _agent()
    assert urllib.request.urlopen(agent.request(config, config["bundle_url"])).read() == data
    agent.put_object(config, b'{"from": 0, "events": []}', 1)
    # The node's POST policy, aimed at another node's prefix, another cluster's, the owner's own
    # objects and the bucket's root: S3 refuses each.
    for aimed in ("gpuprov/pb/reports/pb-2/", "gpuprov/other/reports/x/", "data/", ""):
        with pytest.raises(urllib.error.HTTPError) as refused:
            agent.put_object({**config, "report_prefix": aimed}, b'{"from": 0, "events": []}', 2)
        assert refused.value.code == 403, aimed
        assert front.refused[-1].startswith("Invalid according to Policy: Policy Condition failed"), front.refused
    # Nor may the bundle's URL read the owner's objects.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(agent.request(config, config["bundle_url"].replace(f"/gpuprov/pb/bundle/{sha}.tar.gz",
                                                                                 "/data/keep.bin")))
    assert refused.value.code == 403
    objects = _objects(bucket)
    ours = sorted(k for k in objects if k not in THEIRS)
    assert ours[0] == f"gpuprov/pb/bundle/{sha}.tar.gz" and ours[1].startswith("gpuprov/pb/reports/pb-1/00000001-")
    assert len(ours) == 2 and all(objects[k] == v for k, v in THEIRS.items())
    assert [b["Name"] for b in _s3().list_buckets()["Buckets"]] == [bucket] and _config_of(bucket) == before
    # Recorded for `down`.
    assert json.loads((paths.cluster_dir("pb") / "aws.json").read_text())["pull_buckets"] == [bucket]
    # The owner turns the rest on: said as found.
    _s3().put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    _s3().put_bucket_policy(Bucket=bucket, Policy=json.dumps(s3.tls_only_policy(bucket)))
    said.clear()
    _channel("pb", said)
    assert said[1:] == [f"S3 bucket {bucket}: Block Public Access on (all four settings)",
                        f"S3 bucket {bucket}: default encryption AES256",
                        f"S3 bucket {bucket}: a bucket policy denies requests not made over TLS"]


def test_an_unreachable_or_distant_bucket_stops_with_one_line(front: Front) -> None:
    said: list[str] = []
    with pytest.raises(GpuprovError) as stopped:
        _channel("pb", said)
    assert str(stopped.value).startswith(f"S3 bucket {BUCKET} (the pull_bucket setting) does not exist;")
    _s3().create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    with pytest.raises(GpuprovError) as stopped:
        _channel("pb", said)
    assert f"is in us-west-2, the cluster in {REGION}" in str(stopped.value)
    assert said == [] and [b["Name"] for b in _s3().list_buckets()["Buckets"]] == [BUCKET]
    assert _s3().list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


def test_what_these_credentials_may_not_read_is_said_not_checked(bucket: str, front: Front) -> None:
    """Without the three reads (and GetBucketLocation), `up` goes on and says what it did not
    check; without s3:ListBucket on the prefix, it stops with one line naming the policy."""
    front.deny = {"publicAccessBlock", "encryption", "policy", "location"}
    said: list[str] = []
    channel = _channel("pb", said)
    assert channel.bucket == bucket
    assert said[1:] == [
        f"S3 bucket {bucket}: region not checked (s3:GetBucketLocation refused); it must be the cluster's, "
        f"{REGION}, or the nodes' presigned requests fail",
        f"S3 bucket {bucket}: Block Public Access not checked (s3:GetBucketPublicAccessBlock refused: AccessDenied)",
        f"S3 bucket {bucket}: default encryption not checked (s3:GetEncryptionConfiguration refused: AccessDenied)",
        f"S3 bucket {bucket}: TLS-only policy not checked (s3:GetBucketPolicy refused: AccessDenied)"]
    front.deny = {"list-type"}
    with pytest.raises(GpuprovError) as stopped:
        _channel("pb", said)
    assert str(stopped.value) == (f"AWS refuses s3:ListBucket on S3 bucket {bucket} (prefix gpuprov/pb/) for these "
                                  f"credentials, or the bucket is not this account's ({ACCOUNT}: gpuprov uses no "
                                  "other's); see docs/aws-iam-policy-pull-bucket.json for what gpuprov needs")


def _up(capsys: pytest.CaptureFixture[str], ami: str, name: str) -> None:
    code, _, err = up(capsys, ami, name, count=2, itype="g5.xlarge")
    assert code == 0, err


def _pulled(name: str, bucket: str = BUCKET) -> None:
    """What a pull run leaves in the bucket: the bundle and a node's report batch."""
    channel = _channel(name, [], bucket)
    channel.publish(b"x", hashlib.sha256(b"x").hexdigest())
    _s3().put_object(Bucket=bucket, Key=f"{channel.report_prefix(name + '-node-1')}00000001-ab.json", Body=b"{}")


def test_down_takes_the_clusters_objects_and_leaves_the_bucket(capsys: pytest.CaptureFixture[str], bucket: str,
                                                               ami: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded: `down` finds the buckets in the cluster's aws.json (every one it pulled
    through: `settings --set pull_bucket=` changed it between two `up`s). Unrecorded (state
    lost): in the tag its instances carry. Either way the owner's objects, another cluster's and
    the buckets themselves stay, and the bucket's configuration is as it was."""
    monkeypatch.setenv("GPUPROV_PULL_BUCKET", bucket)
    before = _config_of(bucket)
    _up(capsys, ami, "pb")
    _up(capsys, ami, "lost")
    import boto3

    tags = {t["Key"]: t["Value"] for r in boto3.client("ec2", region_name=REGION).describe_instances()["Reservations"]
            for i in r["Instances"] for t in i["Tags"]}
    assert tags["gpuprov:pull-bucket"] == bucket
    _pulled("pb")
    _pulled("lost")
    _s3().create_bucket(Bucket="team-second")
    _pulled("pb", "team-second")
    assert len(_objects(bucket)) == len(THEIRS) + 4 and len(_objects("team-second")) == 2
    code, _, err = invoke(capsys, "down", "pb", "--yes")
    assert code == 0, err
    assert f"S3 bucket {bucket}: 2 object(s) under gpuprov/pb/ deleted (the bucket is kept" in err
    assert "S3 bucket team-second: 2 object(s) under gpuprov/pb/ deleted" in err and _objects("team-second") == {}
    assert sorted(_objects(bucket)) == sorted([*THEIRS, *(k for k in _objects(bucket) if k.startswith("gpuprov/lost/"))])
    # The state of "lost" is gone (another machine, a wiped GPUPROV_HOME): found by tag.
    Store().delete_cluster("lost")
    code, _, err = invoke(capsys, "down", "lost", "--yes")
    assert code == 0, err
    assert f"S3 bucket {bucket}: 2 object(s) under gpuprov/lost/ deleted" in err
    assert _objects(bucket) == THEIRS
    assert sorted(b["Name"] for b in _s3().list_buckets()["Buckets"]) == [bucket, "team-second"]
    assert _config_of(bucket) == before


@pytest.mark.parametrize("value", ["ab", "a" * 64, "-abc", "abc-", "Team", "a_b", "a..b", "192.168.5.4",
                                   "xn--abc", "sthree-abc", "amzn-s3-demo-x", "abc-s3alias", "abc--ol-s3", "a.mrap",
                                   "abc--x-s3", "gpuprov-rack3-0123456789", "abc\nx", "s3://abc", "{{abc}}"])
def test_a_name_that_is_not_an_s3_bucket_name_is_refused(value: str) -> None:
    from gpuprov import settings
    from gpuprov.errors import BadInput

    with pytest.raises(BadInput) as refused:
        settings.check("pull_bucket", value, "GPUPROV_PULL_BUCKET")
    assert "is not an S3 bucket name" in str(refused.value) and "\n" not in str(refused.value)
    for good in ("abc", "my.bucket-1", "a" * 63, "gpuprov-shared", "1-2.3"):
        assert settings.check("pull_bucket", good, "t") == good


def test_a_bad_bucket_name_is_refused_exit_2_nothing_created(capsys: pytest.CaptureFixture[str], shim: moto_shim.Shim,
                                                             front: Front, ami: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_PULL_BUCKET", "Team_Bucket")
    code, out, err = invoke(capsys, "up", "--name", "bad", "--type", "g5.xlarge", "--count", "1", "--image", ami,
                            "--ssh-cidr", CIDR, "--bootstrap", "pull", "--yes", "-o", "json")
    assert_refused(code, out, err, "GPUPROV_PULL_BUCKET: pull_bucket 'Team_Bucket' is not an S3 bucket name", shim)
    assert _s3().list_buckets()["Buckets"] == []
    # On a recorded cluster: `settings --set` refuses it the same way and records nothing.
    monkeypatch.delenv("GPUPROV_PULL_BUCKET")
    _up(capsys, ami, "good")
    before = Store().get_cluster("good").spec
    code, out, err = invoke(capsys, "settings", "good", "--set", "pull_bucket=192.168.5.4")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "pull_bucket '192.168.5.4' is not an S3 bucket name: not formatted as an IP address" in err
    assert Store().get_cluster("good").spec == before


def test_a_missing_or_distant_bucket_stops_up_before_anything_is_launched(
        capsys: pytest.CaptureFixture[str], shim: moto_shim.Shim, front: Front, ami: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The named bucket is reached before the record and the launch: a bucket that does not
    exist, or lies in another region, is one line and exit 2 with no instance launched and no
    cluster recorded (found only after the launch, it cost instances and a rollback)."""
    _s3_west = __import__("boto3").client("s3", region_name="us-west-2")
    _s3_west.create_bucket(Bucket="team-west", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    for value, needle in (("team-missing", "S3 bucket team-missing (the pull_bucket setting) does not exist"),
                          ("team-west", "S3 bucket team-west (the pull_bucket setting) is in us-west-2")):
        monkeypatch.setenv("GPUPROV_PULL_BUCKET", value)
        code, out, err = invoke(capsys, "up", "--name", "far", "--type", "g5.xlarge", "--count", "1", "--image", ami,
                                "--ssh-cidr", CIDR, "--bootstrap", "pull", "--yes", "-o", "json")
        assert_refused(code, out, err, needle, shim)
    assert sorted(b["Name"] for b in _s3().list_buckets()["Buckets"]) == ["team-west"]


def _named_policy(bucket: str) -> dict[str, Any]:
    """docs/aws-iam-policy.json without its own-bucket S3 statements, plus the named bucket's
    (docs/aws-iam-policy-pull-bucket.json, BUCKET replaced), as docs/aws.md says to attach them."""
    base = json.loads(ROOT_POLICY.read_text())
    named = json.loads(NAMED_POLICY.read_text().replace("BUCKET", bucket))
    base["Statement"] = [s for s in base["Statement"] if not s["Sid"].startswith("GpuprovPull")] + named["Statement"]
    return base


def test_the_prefix_policy_allows_exactly_the_calls_and_nothing_bucket_wide(bucket: str) -> None:
    """Every S3 call of a pull through a named bucket and of its `down` (recorded from botocore's
    own events) is allowed by the prefix-scoped statements on what it acts on; the same on another
    bucket, or outside gpuprov/, is not; none creates, configures or deletes a bucket."""
    from gpuprov.providers.aws import api, s3_named
    from gpuprov.providers.aws import s3 as s3mod
    from tests.aws import iam

    named = json.loads(NAMED_POLICY.read_text())
    stated = {a for s in named["Statement"] for a in iam._as_list(s["Action"])}
    assert not {a for a in stated if a.startswith(("s3:CreateBucket", "s3:PutBucket", "s3:DeleteBucket",
                                                   "s3:PutEncryption", "s3:PutLifecycle", "s3:ListAllMyBuckets"))}
    made: list[tuple[str, dict[str, Any]]] = []
    presigned: list[tuple[str, dict[str, Any]]] = []  # botocore builds a presigned POST with
    presigning = [False]  # CreateBucket's model: no call is made
    aws = api.connect(REGION)
    s3mod.client(aws).meta.events.register("before-parameter-build.s3", lambda model, params, **_: (
        presigned if presigning[0] else made).append((model.name, dict(params))))
    api_connect = api.connect
    try:
        api.connect = lambda *a, **k: aws  # the recorded client for every call
        channel = s3_named.open_channel("pb", bucket, REGION, lambda _: None)
        sha = hashlib.sha256(b"x").hexdigest()
        channel.publish(b"x", sha)
        presigning[0] = True
        urls = channel.node_urls("pb-1", sha)
        presigning[0] = False
        _s3().put_object(Bucket=bucket, Key=f"{channel.report_prefix('pb-1')}00000001-ab.json", Body=b"{}")
        channel.read_object(next(iter(channel.list_reports())))
        channel.remove_reports(["pb-1"])
        s3_named.delete_prefixes(aws, "pb", [bucket], lambda _: None)
    finally:
        api.connect = api_connect
    actions = {"ListObjectsV2": "s3:ListBucket", "GetBucketLocation": "s3:GetBucketLocation",
               "GetPublicAccessBlock": "s3:GetBucketPublicAccessBlock",
               "GetBucketEncryption": "s3:GetEncryptionConfiguration", "GetBucketPolicy": "s3:GetBucketPolicy",
               "GetObject": "s3:GetObject", "PutObject": "s3:PutObject", "DeleteObjects": "s3:DeleteObject"}
    policy, seen = _named_policy(bucket), set()
    for operation, params in made:
        assert operation in actions, f"{operation}: which IAM action? (teach this test)"
        keys = [params["Key"]] if "Key" in params else [o["Key"] for o in params.get("Delete", {}).get("Objects", [])]
        resources = [f"arn:aws:s3:::{bucket}/{k}" for k in keys] or [f"arn:aws:s3:::{bucket}"]
        context = {"s3:prefix": params["Prefix"]} if "Prefix" in params else {}
        for resource in resources:
            auth = iam.Authorization(actions[operation], resource, {**context, **iam.s3_context()})
            assert iam.allowed_by(policy, auth), f"refused: {auth} ({operation})"
            elsewhere = iam.Authorization(auth.action, resource.replace(bucket, "someone-elses"), auth.context)
            assert not iam.allowed_by(policy, elsewhere), f"allowed on another bucket: {elsewhere}"
            theirs = iam.Authorization(auth.action, resource, {**context, **iam.s3_context(OTHER_ACCOUNT)})
            assert not iam.allowed_by(policy, theirs), f"allowed on a bucket of another account: {theirs}"
        seen.add(actions[operation])
    # The node's presigned requests run with the signer's rights: s3:GetObject on its bundle,
    # s3:PutObject on its report prefix.
    assert urls["bundle_url"].split("?")[0].endswith(f"/{bucket}/gpuprov/pb/bundle/{sha}.tar.gz")
    for action, key in (("s3:GetObject", f"gpuprov/pb/bundle/{sha}.tar.gz"),
                        ("s3:PutObject", f"{urls['report_prefix']}00000001-ab.json")):
        assert iam.allowed_by(policy, iam.Authorization(action, f"arn:aws:s3:::{bucket}/{key}", iam.s3_context()))
        assert not iam.allowed_by(policy, iam.Authorization(action, f"arn:aws:s3:::{bucket}/{key}",
                                                            iam.s3_context(OTHER_ACCOUNT)))
    assert stated == seen, f"stated but never used: {sorted(stated - seen)}; used: {sorted(seen - stated)}"
    for outside in ("data/keep.bin", "gpuprovx/a"):  # the owner's objects: neither read, written nor listed
        for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
            assert not iam.allowed_by(policy, iam.Authorization(action, f"arn:aws:s3:::{bucket}/{outside}",
                                                                iam.s3_context()))
    for prefix in ("data/", ""):
        assert not iam.allowed_by(policy, iam.Authorization("s3:ListBucket", f"arn:aws:s3:::{bucket}",
                                                            {"s3:prefix": prefix, **iam.s3_context()}))
    assert not iam.allowed_by(policy, iam.Authorization("s3:ListBucket", f"arn:aws:s3:::{bucket}", iam.s3_context()))


def _dry_run(capsys: pytest.CaptureFixture[str], ami: str) -> tuple[int, str]:
    code, _, err = invoke(capsys, "up", "--name", "dry", "--type", "g5.xlarge", "--count", "2", "--image", ami,
                          "--ssh-cidr", CIDR, "--bootstrap", "pull", "--dry-run", "-o", "json")
    return code, err


def test_the_dry_run_checks_the_prefix_scoped_actions_only(capsys: pytest.CaptureFixture[str], bucket: str, ami: str,
                                                           front: Front, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.providers.aws import s3
    from tests.aws.iam_simulator import Simulator

    monkeypatch.setenv("GPUPROV_PULL_BUCKET", bucket)
    policy = _named_policy(bucket)
    sim = Simulator(policy)
    monkeypatch.setenv("AWS_ENDPOINT_URL_IAM", sim.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sim.url)
    before = _config_of(bucket)
    try:
        code, err = _dry_run(capsys, ami)
        assert code == 0, err
        assert f"dry run: s3:ListBucket allowed (S3 bucket {bucket}, prefix gpuprov/dry/)" in err
        assert f"dry run: s3:GetBucketLocation allowed (S3 bucket {bucket})" in err
        assert f"dry run: S3 bucket {bucket}: warning: Block Public Access is off here" in err
        for action in s3.OBJECT_ACTIONS:
            assert f"dry run: {action} allowed (IAM's policy simulator)" in err, err
        for action in (*s3.BUCKET_ACTIONS, "s3:ListAllMyBuckets"):  # the own bucket's: not asked
            assert f"dry run: {action} allowed (IAM's policy simulator)" not in err
        assert "s3:CreateBucket" not in err and "s3:ListAllMyBuckets" not in err
        assert {r for _, _, r in sim.asked} == {f"arn:aws:s3:::{bucket}/gpuprov/dry/bundle/x.tar.gz"}
        # Without the object statement: refused, said, exit 1.
        sim.policy = copy.deepcopy(policy)
        sim.policy["Statement"] = [s for s in sim.policy["Statement"] if s["Sid"] != "GpuprovPullNamedBucketObjects"]
        code, err = _dry_run(capsys, ami)
        assert code == 1 and "dry run: s3:PutObject REFUSED (IAM's policy simulator: implicitDeny)" in err
        # Nor GetBucketLocation (asked for real): refused too, and the last line names both documents.
        front.deny = {"location"}
        code, err = _dry_run(capsys, ami)
        assert code == 1 and f"dry run: s3:GetBucketLocation REFUSED (S3 bucket {bucket})" in err
        assert err.strip().splitlines()[-1] == (
            "gpuprov: AWS refuses s3:GetBucketLocation, s3:GetObject, s3:PutObject, s3:DeleteObject for these "
            "credentials; see "
            "docs/aws-iam-policy.json and docs/aws-iam-policy-pull-bucket.json for what gpuprov needs")
        front.deny = set()
    finally:
        sim.close()
    for variable in ("AWS_ENDPOINT_URL_IAM", "AWS_ENDPOINT_URL_STS"):  # (moto's STS: the account)
        monkeypatch.delenv(variable)
    # A bucket that does not exist: one line, exit 2 (the setting is wrong), nothing made.
    monkeypatch.setenv("GPUPROV_PULL_BUCKET", "no-such-bucket-here")
    code, err = _dry_run(capsys, ami)
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        "gpuprov: S3 bucket no-such-bucket-here (the pull_bucket setting) does not exist;"), err
    assert [b["Name"] for b in _s3().list_buckets()["Buckets"]] == [bucket] and _config_of(bucket) == before
    assert _objects(bucket) == THEIRS
