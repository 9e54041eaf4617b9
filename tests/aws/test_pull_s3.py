"""Pull mode's S3 channel (gpuprov/providers/aws/s3.py, gpuprov/pull/objects.py, the agent's
object-store transport) against moto's real S3 server, with S3's own checks of presigned
requests in front of it (tests/aws/s3_front.py: moto checks no signature).

The node's side is the real agent (gpuprov/pull/node/agent.py) run in this process, with
its state directory under the test's tmp_path; it reaches S3 only through the presigned URLs
a node is handed."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuprov.pull import Boot, report_secret, report_signature
from gpuprov.pull.objects import ObjectReports
from tests.aws.conftest import REGION, ROOT_POLICY
from tests.aws.s3_front import Front
from tests.unit.node_programs import load_agent

AGENT = Path(__file__).resolve().parents[2] / "gpuprov" / "pull" / "node" / "agent.py"
OTHER_ACCOUNT = "210987654321"


def _s3() -> Any:
    import boto3

    return boto3.client("s3", region_name=REGION)


def _agent() -> Any:
    return load_agent("gpuprov_pull_agent_under_test")


def _channel(name: str = "pl", said: list[str] | None = None) -> Any:
    from gpuprov.providers.aws import s3

    return s3.open_channel(name, REGION, (said if said is not None else []).append)


def test_the_bucket_is_private_encrypted_tagged_expiring_and_tls_only(front: Front) -> None:
    said: list[str] = []
    channel = _channel("pl", said)
    s3 = _s3()
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [channel.bucket]
    assert said == [f"S3 bucket {channel.bucket} created"]
    assert s3.get_bucket_tagging(Bucket=channel.bucket)["TagSet"] == [{"Key": "gpuprov:cluster", "Value": "pl"}]
    block = s3.get_public_access_block(Bucket=channel.bucket)["PublicAccessBlockConfiguration"]
    assert block == {"BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
                     "RestrictPublicBuckets": True}
    (rule,) = s3.get_bucket_encryption(Bucket=channel.bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    (life,) = s3.get_bucket_lifecycle_configuration(Bucket=channel.bucket)["Rules"]
    assert life["Status"] == "Enabled" and life["Filter"] == {"Prefix": "gpuprov/"} and life["Expiration"]["Days"] == 7
    (deny,) = json.loads(s3.get_bucket_policy(Bucket=channel.bucket)["Policy"])["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert set(deny["Resource"]) == {f"arn:aws:s3:::{channel.bucket}", f"arn:aws:s3:::{channel.bucket}/*"}
    # Again: the same bucket, found by tag; nothing new.
    said.clear()
    assert _channel("pl", said).bucket == channel.bucket and said == []
    # A bucket of the pattern that a crash left untagged is the cluster's; one tagged for
    # another cluster, or of another cluster's pattern, is not.
    s3.create_bucket(Bucket="gpuprov-pl-0123456789")
    s3.create_bucket(Bucket="gpuprov-pl-abcdefghij")
    s3.put_bucket_tagging(Bucket="gpuprov-pl-abcdefghij", Tagging={"TagSet": [{"Key": "gpuprov:cluster",
                                                                               "Value": "other"}]})
    s3.create_bucket(Bucket="gpuprov-pl-x-0123456789")
    from gpuprov.providers.aws import api
    from gpuprov.providers.aws import s3 as s3mod

    assert s3mod.find_buckets(api.connect(REGION), "pl") == sorted([channel.bucket, "gpuprov-pl-0123456789"])


def test_a_node_reads_its_bundle_and_writes_under_its_own_prefix_only(front: Front) -> None:
    channel = _channel()
    data = b"bundle bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert channel.publish(data, sha) is True
    assert channel.publish(data, sha) is False  # uploaded once, keyed by its sha256
    boot = Boot(bundle_url="", report_url="", sha256=sha, key=b"k" * 32, channel=channel)
    config = boot.node_config("pl-1", "")
    assert "token" not in config and config["channel"] == "s3"
    agent = _agent()
    assert urllib.request.urlopen(agent.request(config, config["bundle_url"])).read() == data
    # The URL reads that object alone: another key with the same signature is refused; so is
    # the URL without the owner condition it signed (x-amz-expected-bucket-owner).
    other = config["bundle_url"].replace(f"/{sha}.tar.gz", "/x.tar.gz")
    for url, sent in ((other, config), (config["bundle_url"], {**config, "bundle_headers": {}})):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(agent.request(sent, url))
        assert refused.value.code == 403
    agent.put_object(config, b'{"from": 0, "events": []}', 1)
    # Node pl-1's policy, aimed at pl-10's prefix (which starts with pl-1's name) and pl-2's:
    for victim in ("pl-10", "pl-2"):
        aimed = {**config, "report_prefix": channel.report_prefix(victim)}
        with pytest.raises(urllib.error.HTTPError) as refused:
            agent.put_object(aimed, b'{"from": 0, "events": []}', 2)
        assert refused.value.code == 403
    assert front.refused[-1].startswith("Invalid according to Policy: Policy Condition failed")
    keys = list(channel.list_reports())
    assert len(keys) == 1 and keys[0].startswith("gpuprov/pl/reports/pl-1/00000001-"), keys
    # Nothing without a signature: the bucket is private.
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{front.url}/{channel.bucket}/{channel.bundle_key(sha)}")
    assert refused.value.code == 403


def _batch(channel: Any, key: bytes, node: str, seq: int, events: list[dict[str, Any]], start: int = 0,
           sign: bool = True) -> None:
    body = json.dumps({"from": start, "events": events}).encode()
    sig = report_signature(report_secret(key, node), seq, body) if sign else "0" * 64
    _s3().put_object(Bucket=channel.bucket, Key=f"{channel.report_prefix(node)}{seq:08d}-{sig}.json", Body=body)


def test_a_bad_report_counts_against_its_node_only(front: Front) -> None:
    channel = _channel()
    key = b"s" * 32
    good = {"event": "agent", "event_data": {"msg": "started"}}
    _batch(channel, key, "pl-1", 1, [good, {"event": "runner_on_ok", "event_data": {"task": 7}}])  # a bad event
    _batch(channel, key, "pl-2", 1, [good])
    _batch(channel, key, "pl-2", 2, [{"event": "done", "event_data": {"rc": 0}}], start=1)
    _batch(channel, key, "pl-3", 1, [good], sign=False)  # not signed with pl-3's secret
    _batch(channel, key, "pl-4", 3, [good], start=5)  # past a gap: waits, fails nothing
    reports = ObjectReports(channel, key, ["pl-1", "pl-2", "pl-3", "pl-4"], poll_s=0)
    reports.poll()
    assert set(reports.failed) == {"pl-1", "pl-3"}
    assert "event 1: task: a string expected" in reports.failed["pl-1"]
    assert "not signed with this node's report secret" in reports.failed["pl-3"]
    assert [e["event"] for e in reports.events["pl-2"]] == ["agent", "done"]
    assert reports.events["pl-4"] == [] and "pl-4" not in reports.seen
    # What was taken is gone from the bucket (recorded by the controller); the rest stays.
    left = sorted(k.split("/")[3] for k in channel.list_reports())
    assert left == ["pl-1", "pl-3", "pl-4"], left
    lists, reads = channel.listed, channel.read
    reports.poll()  # nothing new: one listing; only the batch past its gap is read again
    assert channel.listed == lists + 1 and channel.read == reads + 1
    assert [e["event"] for e in reports.events["pl-2"]] == ["agent", "done"]


def test_the_agent_refuses_a_tampered_bundle_and_reports_it_through_s3(front: Front, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    channel = _channel()
    data = b"the bundle the controller built"
    sha = hashlib.sha256(data).hexdigest()
    channel.publish(data, sha)
    # Someone with write access to the bucket swaps the object: the node must not run it.
    _s3().put_object(Bucket=channel.bucket, Key=channel.bundle_key(sha), Body=b"another bundle")
    key = b"t" * 32
    boot = Boot(bundle_url="", report_url="", sha256=sha, key=key, channel=channel)
    config_path = tmp_path / "pull.json"
    config_path.write_text(json.dumps(boot.node_config("pl-1", "")))
    agent = _agent()
    monkeypatch.setattr(agent, "STATE", tmp_path / "state")
    rc: list[int] = []
    thread = threading.Thread(target=lambda: rc.append(agent.main(str(config_path))))
    thread.start()
    thread.join(60)
    assert rc == [3] and not config_path.exists()
    assert not (tmp_path / "state" / sha).exists()  # nothing unpacked
    reports = ObjectReports(channel, key, ["pl-1"], poll_s=0)
    reports.poll()
    kinds = [e["event"] for e in reports.events["pl-1"]]
    assert kinds == ["agent", "refused", "done"] and reports.failed == {}, reports.events
    refused = reports.events["pl-1"][1]["event_data"]["msg"]
    assert f"expected {sha}" in refused and hashlib.sha256(b"another bundle").hexdigest() in refused


def test_down_removes_the_bucket_and_finds_an_unrecorded_one(front: Front) -> None:
    from gpuprov.providers.aws import teardown

    channel = _channel()
    channel.publish(b"x", hashlib.sha256(b"x").hexdigest())
    _batch(channel, b"k" * 32, "pl-1", 1, [])
    orphans = teardown.find_orphans("pl", REGION)
    assert orphans is not None and f"S3 bucket {channel.bucket}" in orphans.found
    said: list[str] = []
    teardown.destroy("pl", REGION, said.append)
    assert f"S3 bucket {channel.bucket} deleted (2 object(s))" in said
    assert _s3().list_buckets()["Buckets"] == []
    assert teardown.find_orphans("pl", REGION) is None


def test_the_documented_policy_allows_exactly_the_s3_calls_and_only_on_gpuprov_buckets(front: Front) -> None:
    """Every S3 operation gpuprov made (recorded from botocore's own events) is allowed by
    docs/aws-iam-policy.json on the resource it acts on, in a bucket of the caller's account;
    the same on a bucket gpuprov does not name, or on one another account owns, is not."""
    from gpuprov.providers.aws import api, teardown
    from gpuprov.providers.aws import s3 as s3mod
    from tests.aws import iam

    made: list[tuple[str, dict[str, Any]]] = []
    aws = api.connect(REGION)
    s3mod.client(aws).meta.events.register("before-parameter-build.s3", lambda model, params, **_: made.append(
        (model.name, dict(params))))
    channel = s3mod.Channel(aws=aws, cluster="pl", bucket=s3mod.ensure_bucket(aws, "pl", lambda _: None))
    channel.publish(b"x", hashlib.sha256(b"x").hexdigest())
    channel.node_urls("pl-1", hashlib.sha256(b"x").hexdigest())
    _batch(channel, b"k" * 32, "pl-1", 1, [])
    channel.read_object(next(iter(channel.list_reports())))
    channel.remove_reports(["pl-1"])
    monkey = api.connect
    try:
        api.connect = lambda *a, **k: aws  # the recorded client, for down's calls too
        teardown.delete_cluster_resources(aws, "pl", lambda _: None)
    finally:
        api.connect = monkey
    # What IAM authorizes for each S3 operation (the Service Authorization Reference's
    # "Actions defined by Amazon S3"); presigned requests run with the signer's rights:
    # the node's GET is s3:GetObject, its POST s3:PutObject.
    actions = {"ListBuckets": "s3:ListAllMyBuckets", "GetBucketTagging": "s3:GetBucketTagging",
               "CreateBucket": "s3:CreateBucket", "PutBucketTagging": "s3:PutBucketTagging",
               "PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock",
               "PutBucketEncryption": "s3:PutEncryptionConfiguration",
               "PutBucketLifecycleConfiguration": "s3:PutLifecycleConfiguration",
               "PutBucketPolicy": "s3:PutBucketPolicy", "HeadObject": "s3:GetObject", "GetObject": "s3:GetObject",
               "PutObject": "s3:PutObject", "ListObjectsV2": "s3:ListBucket",
               "DeleteObjects": "s3:DeleteObject",
               "DeleteBucket": "s3:DeleteBucket"}
    policy = json.loads(ROOT_POLICY.read_text())
    seen = set()
    for operation, params in made:
        assert operation in actions, f"{operation}: which IAM action? (teach this test)"
        bucket = params.get("Bucket")
        keys = [params["Key"]] if "Key" in params else [o["Key"] for o in params.get("Delete", {}).get("Objects", [])]
        resources = ["*"] if bucket is None else [f"arn:aws:s3:::{bucket}/{k}" for k in keys] or [
            f"arn:aws:s3:::{bucket}"]
        for resource in resources:
            auth = iam.Authorization(actions[operation], resource, iam.s3_context())
            assert iam.allowed_by(policy, auth), f"refused: {auth} ({operation})"
            if bucket is not None:
                elsewhere = iam.Authorization(actions[operation], resource.replace(bucket, "someone-elses-bucket"),
                                              iam.s3_context())
                assert not iam.allowed_by(policy, elsewhere), f"allowed outside gpuprov's buckets: {elsewhere}"
            if bucket is not None and operation != "CreateBucket":  # (a name another account owns: refused)
                theirs = iam.Authorization(actions[operation], resource, iam.s3_context(OTHER_ACCOUNT))
                assert not iam.allowed_by(policy, theirs), f"allowed on another account's bucket: {theirs}"
        seen.add(actions[operation])
    for action in ("s3:GetObject", "s3:PutObject"):  # the nodes' presigned requests
        resource = f"arn:aws:s3:::{channel.bucket}/gpuprov/pl/x"
        assert iam.allowed_by(policy, iam.Authorization(action, resource, iam.s3_context()))
        assert not iam.allowed_by(policy, iam.Authorization(action, resource, iam.s3_context(OTHER_ACCOUNT)))
    stated = {a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
              if a.startswith("s3:")}
    assert stated == seen, f"in the policy but never used: {sorted(stated - seen)}; used: {sorted(seen - stated)}"


def _dry_run(capsys: pytest.CaptureFixture[str], ami: str) -> tuple[int, str]:
    from tests.aws.helpers import CIDR, invoke

    code, _, err = invoke(capsys, "up", "--name", "dry", "--type", "p4d.24xlarge", "--count", "2", "--image", ami,
                          "--ssh-cidr", CIDR, "--bootstrap", "pull", "--dry-run", "-o", "json")
    return code, err


def test_the_dry_run_of_a_pull_up_checks_the_s3_actions(capsys: pytest.CaptureFixture[str], front: Front, ami: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.aws.iam_simulator import CALLER, Simulator

    policy = json.loads(ROOT_POLICY.read_text())
    sim = Simulator(policy)
    monkeypatch.setenv("AWS_ENDPOINT_URL_IAM", sim.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sim.url)
    try:
        code, err = _dry_run(capsys, ami)
        assert code == 0, err
        assert "dry run: s3:ListAllMyBuckets allowed" in err
        from gpuprov.providers.aws import s3

        for action in (*s3.BUCKET_ACTIONS, *s3.OBJECT_ACTIONS):
            assert f"dry run: {action} allowed (IAM's policy simulator)" in err, err
        assert {p for p, _, _ in sim.asked} == {CALLER} and _s3().list_buckets()["Buckets"] == []
        # Asked on a bucket of the caller's account, as gpuprov makes its calls.
        from tests.aws import iam

        assert sim.contexts and all(c == iam.s3_context() for c in sim.contexts), sim.contexts
        # The same credentials without s3:PutBucketPolicy: refused, said, exit 1, nothing made.
        for statement in policy["Statement"]:
            if "s3:PutBucketPolicy" in statement["Action"]:
                statement["Action"] = [a for a in statement["Action"] if a != "s3:PutBucketPolicy"]
        code, err = _dry_run(capsys, ami)
        assert code == 1 and "dry run: s3:PutBucketPolicy REFUSED (IAM's policy simulator: implicitDeny)" in err
        assert err.strip().splitlines()[-1] == ("gpuprov: AWS refuses s3:PutBucketPolicy for these credentials; "
                                                "see docs/aws-iam-policy.json for what gpuprov needs")
    finally:
        sim.close()
    # Where the simulator cannot answer (moto has none), each action is said to be not checked.
    monkeypatch.delenv("AWS_ENDPOINT_URL_IAM")
    monkeypatch.delenv("AWS_ENDPOINT_URL_STS")
    code, err = _dry_run(capsys, ami)
    assert code == 0 and "dry run: s3:CreateBucket not checked (S3 has no dry run; IAM's policy simulator: " in err
    assert _s3().list_buckets()["Buckets"] == []


def test_auto_pulls_through_s3_above_32_nodes_on_aws(capsys: pytest.CaptureFixture[str], front: Front,
                                                      ami: str) -> None:
    from tests.aws.helpers import CIDR, invoke

    for count, pulls in ((33, True), (32, False)):
        code, _, err = invoke(capsys, "up", "--name", "auto", "--type", "g5.xlarge", "--count", str(count),
                              "--image", ami, "--ssh-cidr", CIDR, "--dry-run", "-o", "json")
        assert code == 0, err
        assert ("  bootstrap: pull (" in err) is pulls and ("dry run: s3:ListAllMyBuckets allowed" in err) is pulls
    assert _s3().list_buckets()["Buckets"] == []
