"""Pull mode's channel on AWS: the cluster's private S3 bucket (`up --provider aws --bootstrap pull`).

A controller on a laptop or a CI runner cannot serve HTTP to instances in a VPC; S3 is the
channel both can reach. Per cluster, one bucket ``gpuprov-CLUSTER-RANDOM``, made with:

- the tag ``gpuprov:cluster`` (given at creation, and set again: `down` finds the bucket by
  its name's pattern and tag when no state records it, a crash between the create and the
  tag included);
- Block Public Access (all four settings), default encryption (SSE-S3), a lifecycle rule
  that expires every object gpuprov writes (``gpuprov/``) after ``EXPIRE_DAYS``, and a bucket
  policy that denies any request not made over TLS.

What goes in it, under ``gpuprov/CLUSTER/``:

- ``bundle/SHA256.tar.gz``: the bootstrap bundle, uploaded once (a replacement round, or
  another `up` with the same bundle, finds it there and uploads nothing); each node is given
  a presigned GET for it, valid for the bootstrap's time budget, and the sha256 it checks.
- ``reports/NODE/SEQ-SIGNATURE.json``: a node's numbered report batches, written through a
  presigned POST whose policy S3 enforces: the key starts with that node's prefix, the
  bucket is this one, the body is 1 byte to MAX_REPORT. A node holds no other credential,
  so it cannot write under another node's prefix (S3 refuses the POST) nor read anything
  but its bundle.

boto3's S3 client signs with SigV4 (presigned URLs and POST policies alike). Only the
controller holds AWS credentials; a node holds its presigned GET and POST policy alone.

Every bucket and object call expects the bucket to be this account's (``ExpectedBucketOwner``,
the credentials' account from STS, asked once per command): a bucket name that now belongs to
another account (a ``pull_bucket`` deleted and claimed, a typo) is refused by S3 (403), never
used. The node's presigned GET carries the same condition as a signed header it must send
(``bundle_headers``); S3's POST upload has no such field, so the report POST relies on the IAM
policy's ``s3:ResourceAccount`` condition (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.providers import Reporter
from gpuprov.providers.aws import api
from gpuprov.providers.aws.common import TAG

ROOT = "gpuprov/"  # every object gpuprov writes, under ROOT + CLUSTER + "/"
EXPIRE_DAYS = 7  # the lifecycle rule: a bootstrap's objects are gone a week after it, `down` or not
MAX_EXPIRES_S = 7 * 24 * 3600  # SigV4's longest presigned validity
MAX_REPORT = 8 << 20  # bytes in one report batch (as the HTTP server takes: gpuprov/pull/server.py)
_SUFFIX = 10  # random characters after the cluster's name (bucket names are global)
_ALPHABET = string.ascii_lowercase + string.digits
OWNER = "ExpectedBucketOwner"  # S3's bucket owner condition (header x-amz-expected-bucket-owner)
OWNER_HEADER = "x-amz-expected-bucket-owner"


def bucket_pattern(cluster: str) -> re.Pattern[str]:
    return re.compile(rf"gpuprov-{re.escape(cluster)}-[a-z0-9]{{{_SUFFIX}}}")


def client(aws: api.Aws) -> Any:
    """The region's S3 client: SigV4 (presigned URLs and POST policies), adaptive retries."""
    cache = aws.__dict__.setdefault("_clients", {})
    if "s3v4" not in cache:
        cache["s3v4"] = aws.session.client("s3", region_name=aws.region, config=api.Config(
            signature_version="s3v4", retries={"mode": "adaptive", "max_attempts": aws.attempts},
            connect_timeout=10, read_timeout=60, user_agent_extra="gpuprov"))
        cache["s3v4"].meta.events.register("before-parameter-build.s3", _owner_expected(aws),
                                           unique_id="gpuprov-expected-bucket-owner")
    return cache["s3v4"]


def _owner_expected(aws: api.Aws) -> Any:
    """Every S3 operation that takes ExpectedBucketOwner (all but ListBuckets and CreateBucket
    of gpuprov's) gets this account's id, presigned ones included (a signed header there)."""

    def handler(params: dict[str, Any], model: Any, **_: Any) -> None:
        shape = model.input_shape
        if shape is not None and OWNER in shape.members:
            params.setdefault(OWNER, aws.account)

    return handler


def find_buckets(aws: api.Aws, cluster: str) -> list[str]:
    """The buckets gpuprov made for ``cluster``: named by its pattern, and tagged with the
    cluster or (a crash between create and tag) not tagged at all."""
    s3, pattern, out = client(aws), bucket_pattern(cluster), []
    for page in s3.get_paginator("list_buckets").paginate(Prefix=f"gpuprov-{cluster}-"):
        for bucket in page.get("Buckets", []):
            name = bucket["Name"]
            if not pattern.fullmatch(name):
                continue
            try:
                tags = {t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket=name)["TagSet"]}
            except api.ClientError as exc:
                if api.error_code(exc) != "NoSuchTagSet":
                    raise
                tags = {}
            if tags.get(TAG, cluster) == cluster:
                out.append(name)
    return sorted(out)


def ensure_bucket(aws: api.Aws, cluster: str, report: Reporter) -> str:
    """The cluster's bucket: the one found by tag, else a new one; its settings applied either
    way (each call below sets a whole configuration: applying it again changes nothing)."""
    found = find_buckets(aws, cluster)
    s3 = client(aws)
    if found:
        name = found[0]
    else:
        name = f"gpuprov-{cluster}-" + "".join(secrets.choice(_ALPHABET) for _ in range(_SUFFIX))
        config: dict[str, Any] = {"Tags": [{"Key": TAG, "Value": cluster}]}
        if aws.region != "us-east-1":
            config["LocationConstraint"] = aws.region
        s3.create_bucket(Bucket=name, CreateBucketConfiguration=config, ObjectOwnership="BucketOwnerEnforced")
        report(f"S3 bucket {name} created")
    secure(s3, name, cluster)
    return name


def secure(s3: Any, bucket: str, cluster: str) -> None:
    s3.put_bucket_tagging(Bucket=bucket, Tagging={"TagSet": [{"Key": TAG, "Value": cluster}]})
    block_public(s3, bucket)
    encrypt(s3, bucket)
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [
        {"ID": "gpuprov-bootstrap-expiry", "Status": "Enabled", "Filter": {"Prefix": ROOT},
         "Expiration": {"Days": EXPIRE_DAYS}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]})
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(tls_only_policy(bucket)))


def block_public(s3: Any, bucket: str) -> None:
    """Block Public Access, all four settings."""
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})


def encrypt(s3: Any, bucket: str, kms_key: str | None = None) -> None:
    """Default encryption: SSE-KMS with ``kms_key`` where one is named, else SSE-S3."""
    default = {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": kms_key} if kms_key else {"SSEAlgorithm": "AES256"}
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={"Rules": [
        {"ApplyServerSideEncryptionByDefault": default, "BucketKeyEnabled": True}]})


def tls_only_policy(bucket: str) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "GpuprovTlsOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}


@dataclass
class Channel:
    """One cluster's pull channel in its bucket (gpuprov.pull.objects reads it): the bundle's
    upload, each node's presigned GET and POST policy, the reports listed and read."""

    aws: api.Aws
    cluster: str
    bucket: str
    expires_s: int = 3600
    listed: int = field(default=0)  # ListObjectsV2 requests made (the controller's cost per refresh)
    read: int = field(default=0)  # GetObject requests made

    @property
    def prefix(self) -> str:
        return f"{ROOT}{self.cluster}/"

    def bundle_key(self, sha256: str) -> str:
        return f"{self.prefix}bundle/{sha256}.tar.gz"

    def report_prefix(self, node: str) -> str:
        return f"{self.prefix}reports/{node}/"

    def publish(self, data: bytes, sha256: str) -> bool:
        """The bundle in the bucket under its sha256; False when it was there already (the same
        bytes: S3 checked them against their sha256 when they were put)."""
        s3, key = client(self.aws), self.bundle_key(sha256)
        # Listed, not HEAD: where s3:ListBucket is granted for gpuprov/ only (a bucket named by
        # the pull_bucket setting: s3_named.py), S3 answers a HEAD of a missing key 403, not 404.
        found = s3.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        if any(o["Key"] == key and o["Size"] == len(data) for o in found):
            return False
        if hashlib.sha256(data).hexdigest() != sha256:
            raise GpuprovError("the bundle's bytes are not those of its sha256; not uploaded")
        s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/gzip",
                      ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode())
        return True

    def node_urls(self, node: str, sha256: str, expires_s: int | None = None) -> dict[str, Any]:
        """What one node is given: a presigned GET of the bundle, and a presigned POST for its
        own report prefix (S3 enforces the policy's conditions), both valid ``expires_s`` (the
        bootstrap's time budget; at most SigV4's 7 days, and no longer than the signing
        credentials live: a URL signed with a role's session dies with the session)."""
        s3, prefix = client(self.aws), self.report_prefix(node)
        expires = min(expires_s or self.expires_s, MAX_EXPIRES_S)
        # The owner condition is signed as a header: the node sends it (bundle_headers), and S3
        # refuses the GET of a bucket another account owns. A POST upload has no such field.
        owner = self.aws.account
        get = s3.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self.bundle_key(sha256),
                                                              OWNER: owner}, ExpiresIn=expires)
        post = s3.generate_presigned_post(
            self.bucket, prefix + "${filename}",
            Conditions=[["starts-with", "$key", prefix], ["content-length-range", 1, MAX_REPORT]],
            ExpiresIn=expires)
        return {"channel": "s3", "bundle_url": get, "bundle_headers": {OWNER_HEADER: owner}, "report_url": post["url"],
                "report_fields": {k: v for k, v in post["fields"].items() if k != "key"}, "report_prefix": prefix}

    def list_reports(self) -> dict[str, int]:
        """Every report object of this cluster: {key: size}."""
        s3, out = client(self.aws), dict[str, int]()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}reports/"):
            self.listed += 1
            out.update((o["Key"], o["Size"]) for o in page.get("Contents", []))
        return out

    def read_object(self, key: str, limit: int = MAX_REPORT) -> bytes:
        self.read += 1
        body = client(self.aws).get_object(Bucket=self.bucket, Key=key)["Body"]
        return bytes(body.read(limit + 1))

    def delete_keys(self, keys: list[str]) -> None:
        """These objects (report batches the controller has taken), 1000 to a request."""
        s3 = client(self.aws)
        for at in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys[at:at + 1000]],
                                                          "Quiet": True})

    def remove_reports(self, nodes: list[str]) -> None:
        """The report objects of these nodes (recorded by the controller once read)."""
        for node in nodes:
            delete_prefix(client(self.aws), self.bucket, self.report_prefix(node))


def delete_prefix(s3: Any, bucket: str, prefix: str) -> int:
    """Every object under ``prefix`` (gpuprov never turns versioning on); how many."""
    gone = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:  # a page holds at most 1000 keys, as DeleteObjects takes
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
        gone += len(keys)
    return gone


# The S3 actions of pull mode (docs/aws-iam-policy.json): on the cluster's bucket, and on the
# objects under ROOT in it. (s3:ListAllMyBuckets, on "*", is asked for real: it reads only.)
BUCKET_ACTIONS = ("s3:CreateBucket", "s3:DeleteBucket", "s3:GetBucketTagging", "s3:PutBucketTagging",
                  "s3:PutBucketPublicAccessBlock", "s3:PutEncryptionConfiguration", "s3:PutLifecycleConfiguration",
                  "s3:PutBucketPolicy", "s3:ListBucket")
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
DENIED = ("AccessDenied", "AllAccessDisabled", "UnauthorizedOperation")


def dry_run(aws: api.Aws, cluster: str, report: Reporter) -> list[str]:
    """`up --dry-run --bootstrap pull`: whether these credentials may make pull mode's S3 calls;
    the refused ones. S3 has no DryRun: s3:ListAllMyBuckets is asked for real (it only reads),
    the others through IAM's policy simulator on the caller's own principal, where the
    credentials may call it (iam:SimulatePrincipalPolicy, not in the minimal policy); where
    not, each is said to be not checked."""
    refused = []
    try:
        client(aws).list_buckets(Prefix=f"gpuprov-{cluster}-", MaxBuckets=1)
        report("dry run: s3:ListAllMyBuckets allowed")
    except api.ClientError as exc:
        if api.error_code(exc) not in DENIED:
            raise
        report(f"dry run: s3:ListAllMyBuckets REFUSED ({api.error_code(exc)})")
        refused.append("s3:ListAllMyBuckets")
    bucket = f"arn:aws:s3:::gpuprov-{cluster}-{'0' * _SUFFIX}"
    asks = ((BUCKET_ACTIONS, bucket), (OBJECT_ACTIONS, f"{bucket}/{ROOT}{cluster}/bundle/x.tar.gz"))
    return refused + simulate(aws, asks, report)


def simulate(aws: api.Aws, asks: tuple[tuple[tuple[str, ...], str], ...], report: Reporter) -> list[str]:
    """Each (actions, resource ARN) asked of IAM's policy simulator on the caller's own
    principal; the refused actions. Where the simulator cannot be asked, each is said to be
    not checked (and none counts as refused)."""
    refused: list[str] = []
    try:
        principal = caller_principal(aws)
        # Asked as gpuprov makes them: on a bucket of this account (the policy's s3:ResourceAccount).
        context = [{"ContextKeyName": key, "ContextKeyValues": [aws.account], "ContextKeyType": "string"}
                   for key in ("s3:ResourceAccount", "aws:PrincipalAccount")]
        iam = aws.session.client("iam", region_name=aws.region, config=api.Config(retries={"max_attempts": 2}))
        results = [r for actions, arn in asks for r in iam.simulate_principal_policy(
            PolicySourceArn=principal, ActionNames=list(actions), ResourceArns=[arn],
            ContextEntries=context)["EvaluationResults"]]
    except (api.ClientError, api.BotoCoreError, ValueError) as exc:
        why = api.error_code(exc) if isinstance(exc, api.ClientError) else type(exc).__name__
        for actions, _ in asks:
            for action in actions:
                report(f"dry run: {action} not checked (S3 has no dry run; IAM's policy simulator: {why})")
        return refused
    for result in results:
        action, decision = result["EvalActionName"], result["EvalDecision"]
        if decision == "allowed":
            report(f"dry run: {action} allowed (IAM's policy simulator)")
        else:
            report(f"dry run: {action} REFUSED (IAM's policy simulator: {decision})")
            refused.append(action)
    return refused


def caller_principal(aws: api.Aws) -> str:
    """The IAM principal of these credentials, as the policy simulator takes it (an assumed
    role's session is its role); ValueError for one it cannot take (the account's root)."""
    arn = aws.identity()["arn"]
    parts = arn.split(":", 5)
    if len(parts) == 6 and parts[2] == "sts" and parts[5].startswith("assumed-role/"):
        role = parts[5].split("/")[1]
        return f"arn:{parts[1]}:iam::{parts[4]}:role/{role}"
    if len(parts) == 6 and parts[2] == "iam" and parts[5].startswith(("user/", "role/")):
        return arn
    raise ValueError(f"the principal {arn} cannot be simulated")


def open_channel(cluster: str, region: str | None, report: Reporter, expires_s: int = 3600) -> Channel:
    aws = api.connect(region)
    return Channel(aws=aws, cluster=cluster, bucket=ensure_bucket(aws, cluster, report), expires_s=expires_s)


def tagged_buckets(aws: api.Aws, cluster: str) -> list[str]:
    """The cluster's buckets, for `down` and the orphan search: [] where S3 refuses the listing
    (credentials without s3:ListAllMyBuckets never made one)."""
    try:
        return find_buckets(aws, cluster)
    except api.ClientError as exc:
        if api.error_code(exc) in ("AccessDenied", "AllAccessDisabled"):
            return []
        raise


def delete_buckets(aws: api.Aws, cluster: str, report: Reporter) -> None:
    """The cluster's buckets and everything in them (gpuprov made them for it alone)."""
    s3 = client(aws)
    for bucket in tagged_buckets(aws, cluster):
        gone = delete_prefix(s3, bucket, "")
        s3.delete_bucket(Bucket=bucket)
        report(f"S3 bucket {bucket} deleted ({gone} object(s))")
