"""Pull mode's channel in a bucket named by the cluster's ``pull_bucket`` setting, for accounts
that forbid creating buckets (docs/settings.md).

The same objects as in the cluster's own bucket (s3.py), under the same prefix
``gpuprov/CLUSTER/`` (the bundle, each node's reports; the nodes' presigned GET and POST
policy), in a bucket gpuprov never creates, re-configures or deletes:

- each `up` (and `up --dry-run`) checks it can reach it (ListObjectsV2 on the cluster's prefix),
  that it is in the cluster's region (a presigned URL is signed for one region), and says what
  it finds: Block Public Access, default encryption, a bucket policy that denies requests not
  made over TLS. What is missing is said as a warning, never changed (the bucket's owner
  decides); what these credentials may not read is said to be not checked;
- `down` deletes the objects under ``gpuprov/CLUSTER/``, nothing else. It finds the bucket in
  the cluster's ``aws.json`` (written each time the channel opens) and in the tag
  ``gpuprov:pull-bucket`` its instances carry (a cluster whose state is lost).

The IAM statements this needs, scoped to the bucket and the prefix (no s3:CreateBucket, no
s3:PutBucket*, no s3:DeleteBucket, no s3:ListAllMyBuckets): docs/aws-iam-policy-pull-bucket.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import Reporter
from gpuprov.providers.aws import api, s3

POLICY_DOC = "docs/aws-iam-policy-pull-bucket.json"
# What a named bucket needs, besides s3.OBJECT_ACTIONS on BUCKET/gpuprov/*: asked for real (reads).
BUCKET_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation")
# What gpuprov reads to say what it finds; one refused is said to be not checked, and `up` goes on.
INSPECT_ACTIONS = ("s3:GetBucketPublicAccessBlock", "s3:GetEncryptionConfiguration", "s3:GetBucketPolicy")
_MISSING = {"NoSuchPublicAccessBlockConfiguration", "ServerSideEncryptionConfigurationNotFoundError",
            "NoSuchBucketPolicy"}


def named(settings: dict[str, Any] | None) -> str | None:
    """The bucket a cluster's recorded settings name (``pull_bucket``), or None."""
    value = ((settings or {}).get("pull_bucket") or {}).get("value")
    return str(value) if value else None


def prefix(cluster: str) -> str:
    return f"{s3.ROOT}{cluster}/"


def reach(aws: api.Aws, bucket: str, cluster: str) -> str | None:
    """ListObjectsV2 on the cluster's prefix, and the bucket's region (None: GetBucketLocation
    refused). BadInput where the bucket is missing or in another region than the cluster's (the
    setting is wrong), GpuprovError where these credentials may not list it."""
    client = s3.client(aws)
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix(cluster), MaxKeys=1)
    except api.ClientError as exc:
        code = api.error_code(exc)
        if code == "NoSuchBucket":
            raise BadInput(f"S3 bucket {bucket} (the pull_bucket setting) does not exist; gpuprov creates "
                           "no bucket there: name an existing one, or unset pull_bucket") from None
        if code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"):
            raise BadInput(f"S3 bucket {bucket} (the pull_bucket setting) is not in the cluster's region "
                           f"{aws.region}; name a bucket there") from None
        if code in s3.DENIED:
            # S3 answers the same 403 where the bucket is another account's (ExpectedBucketOwner).
            raise GpuprovError(f"AWS refuses s3:ListBucket on S3 bucket {bucket} (prefix {prefix(cluster)}) for "
                               f"these credentials, or the bucket is not this account's ({aws.account}: gpuprov "
                               f"uses no other's); see {POLICY_DOC} for what gpuprov needs") from None
        raise
    where = location(aws, bucket)
    if where is not None and where != aws.region:
        raise BadInput(f"S3 bucket {bucket} (the pull_bucket setting) is in {where}, the cluster in "
                       f"{aws.region}: presigned URLs are signed for one region; name a bucket in {aws.region}")
    return where


def location(aws: api.Aws, bucket: str) -> str | None:
    """The bucket's region; None where GetBucketLocation is refused."""
    try:
        found = s3.client(aws).get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except api.ClientError as exc:
        if api.error_code(exc) in s3.DENIED:
            return None
        raise
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(found, found)


def inspect(aws: api.Aws, bucket: str) -> list[str]:
    """What the bucket's owner set that gpuprov relies on, one line each: found, missing (a
    warning) or not checked (these credentials may not read it). Nothing is changed."""
    client, out = s3.client(aws), []
    reads = (("Block Public Access", "s3:GetBucketPublicAccessBlock", client.get_public_access_block, _public),
             ("default encryption", "s3:GetEncryptionConfiguration", client.get_bucket_encryption, _encryption),
             ("TLS-only policy", "s3:GetBucketPolicy", client.get_bucket_policy, _tls_only))
    for what, action, call, judge in reads:
        try:
            answer = call(Bucket=bucket)
        except api.ClientError as exc:
            code = api.error_code(exc)
            if code in s3.DENIED:
                out.append(f"S3 bucket {bucket}: {what} not checked ({action} refused: {code})")
                continue
            if code not in _MISSING:
                raise
            answer = None
        out.append(f"S3 bucket {bucket}: {judge(answer, bucket)}")
    return out


def _public(answer: dict[str, Any] | None, bucket: str) -> str:
    config = (answer or {}).get("PublicAccessBlockConfiguration") or {}
    off = [k for k in ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
           if not config.get(k)]
    if not off:
        return "Block Public Access on (all four settings)"
    return (f"warning: Block Public Access is off here ({', '.join(off)}; the account's own may still apply): "
            "a policy or ACL of the bucket could make the bundle and the reports public; gpuprov changes nothing")


def _encryption(answer: dict[str, Any] | None, bucket: str) -> str:
    rules = ((answer or {}).get("ServerSideEncryptionConfiguration") or {}).get("Rules") or []
    kinds = sorted({r.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm", "") for r in rules} - {""})
    if kinds:
        return f"default encryption {', '.join(kinds)}"
    return "warning: no default encryption found; gpuprov changes nothing"


def _tls_only(answer: dict[str, Any] | None, bucket: str) -> str:
    try:
        policy = json.loads((answer or {}).get("Policy") or "{}")
    except ValueError:
        policy = {}
    statements = policy.get("Statement") or []
    if not any(_denies_plain_http(s, bucket) for s in (statements if isinstance(statements, list) else [statements])):
        return ("warning: no bucket policy statement denies requests not made over TLS "
                "(aws:SecureTransport false); gpuprov changes nothing")
    return "a bucket policy denies requests not made over TLS"


def _denies_plain_http(statement: Any, bucket: str) -> bool:
    """A Deny of every principal's object reads and writes, on the bucket's objects, where
    aws:SecureTransport is false."""
    if not isinstance(statement, dict) or statement.get("Effect") != "Deny":
        return False
    if statement.get("Principal") not in ("*", {"AWS": "*"}):
        return False
    actions = _listed(statement.get("Action"))
    resources = _listed(statement.get("Resource"))
    condition = (statement.get("Condition") or {}).get("Bool") or {}
    return (str(condition.get("aws:SecureTransport", "")).lower() == "false"
            and bool({"s3:*", "*"} & actions or {"s3:GetObject", "s3:PutObject"} <= actions)
            and bool({f"arn:aws:s3:::{bucket}/*", "*"} & resources))


def _listed(value: Any) -> set[str]:
    return {value} if isinstance(value, str) else {v for v in value or [] if isinstance(v, str)}


def open_channel(cluster: str, bucket: str, region: str | None, report: Reporter, expires_s: int = 3600) -> s3.Channel:
    """The cluster's channel under ``gpuprov/CLUSTER/`` in ``bucket``: reached, its region
    checked, what its owner set said."""
    aws = api.connect(region)
    where = reach(aws, bucket, cluster)
    report(f"S3 bucket {bucket} (pull_bucket): the cluster's objects go under {prefix(cluster)}; "
           "gpuprov neither makes, changes nor deletes this bucket")
    if where is None:
        report(f"S3 bucket {bucket}: region not checked (s3:GetBucketLocation refused); it must be the "
               f"cluster's, {aws.region}, or the nodes' presigned requests fail")
    for line in inspect(aws, bucket):
        report(line)
    return s3.Channel(aws=aws, cluster=cluster, bucket=bucket, expires_s=expires_s)


def dry_run(aws: api.Aws, cluster: str, bucket: str, report: Reporter) -> list[str]:
    """`up --dry-run --bootstrap pull` with a named bucket: ListObjectsV2 on the cluster's
    prefix and GetBucketLocation asked for real (reads), what the bucket has said, and the
    object actions through IAM's policy simulator (s3.simulate); the refused actions. A
    bucket that does not exist, or lies in another region, stops it (GpuprovError)."""
    try:
        where = reach(aws, bucket, cluster)
    except GpuprovError as exc:
        if "AWS refuses s3:ListBucket" not in str(exc):
            raise
        report(f"dry run: s3:ListBucket REFUSED (S3 bucket {bucket}, prefix {prefix(cluster)})")
        return ["s3:ListBucket"]
    report(f"dry run: s3:ListBucket allowed (S3 bucket {bucket}, prefix {prefix(cluster)})")
    refused = []
    if where is None:
        report(f"dry run: s3:GetBucketLocation REFUSED (S3 bucket {bucket})")
        refused.append("s3:GetBucketLocation")
    else:
        report(f"dry run: s3:GetBucketLocation allowed (S3 bucket {bucket})")
    for line in inspect(aws, bucket):
        report(f"dry run: {line}")
    arn = f"arn:aws:s3:::{bucket}/{prefix(cluster)}bundle/x.tar.gz"
    return refused + s3.simulate(aws, ((s3.OBJECT_ACTIONS, arn),), report)


def delete_prefixes(aws: api.Aws, cluster: str, buckets: Iterable[str], report: Reporter) -> None:
    """`down`: the objects under ``gpuprov/CLUSTER/`` in each named bucket; the buckets stay.
    One gone already, or these credentials refused: said, and `down` goes on."""
    for bucket in sorted(set(buckets)):
        try:
            gone = s3.delete_prefix(s3.client(aws), bucket, prefix(cluster))
        except api.ClientError as exc:
            code = api.error_code(exc)
            if code != "NoSuchBucket" and code not in s3.DENIED:
                raise
            report(f"S3 bucket {bucket}: objects under {prefix(cluster)} not deleted ({code})")
            continue
        report(f"S3 bucket {bucket}: {gone} object(s) under {prefix(cluster)} deleted (the bucket is kept: "
               "gpuprov did not make it)")
