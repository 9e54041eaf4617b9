"""The bucket a team's state lives in (gpuprov.state_s3; docs/team-state.md): made on request by
`gpuprov state bucket s3://BUCKET/PREFIX`, and checked before gpuprov keeps records there.

What it must have, each refused by name where missing: this account as its owner (every call
passes ExpectedBucketOwner: s3.client), Block Public Access (all four settings), default
encryption (SSE-KMS with the key the team names, else SSE-S3), versioning on (a bad write is
undone by restoring the version before it), and a bucket policy that denies requests not made
over TLS. gpuprov changes a bucket it did not make in nothing: it says what is missing.

The pull bucket's helpers do the work (s3.block_public, s3.encrypt, s3.tls_only_policy, and
s3_named.inspect, which reads what a bucket has); a state bucket has no lifecycle rule (records
never expire) and no cluster tag (it serves every cluster of the team).
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput
from gpuprov.providers import Reporter
from gpuprov.providers.aws import api, s3, s3_named
from gpuprov.state_choice import S3Location

POLICY_DOC = "docs/aws-iam-policy-state.json"
CHECKED_FILE = "state-bucket.json"  # in the state directory: {s3://B: {account, when}}
RECHECK_S = 24 * 3600  # a bucket's settings are read again, from each state directory, after this


def create(aws: api.Aws, where: S3Location, kms_key: str | None, report: Reporter) -> None:
    """The bucket, made with everything the state needs; one that exists already (this
    account's) is checked, not changed."""
    client = s3.client(aws)
    if kms_key:
        _kms_key_of_this_account(aws, kms_key)
    if _exists(aws, where.bucket):
        report(f"S3 bucket {where.bucket} exists (this account's, {aws.account}): checked, not changed")
    else:
        config: dict[str, Any] = {}
        if aws.region != "us-east-1":
            config["CreateBucketConfiguration"] = {"LocationConstraint": aws.region}
        api.call(client.create_bucket, f"s3:CreateBucket {where.bucket}", Bucket=where.bucket,
                 ObjectOwnership="BucketOwnerEnforced", **config)
        s3.block_public(client, where.bucket)
        s3.encrypt(client, where.bucket, kms_key)
        client.put_bucket_versioning(Bucket=where.bucket, VersioningConfiguration={"Status": "Enabled"})
        client.put_bucket_policy(Bucket=where.bucket, Policy=json.dumps(s3.tls_only_policy(where.bucket)))
        report(f"S3 bucket {where.bucket} created in {aws.region}: Block Public Access, default encryption "
               f"{'SSE-KMS (' + kms_key + ')' if kms_key else 'SSE-S3'}, versioning, TLS-only policy")
    refuse_unfit(aws, where.bucket)
    _record_checked(aws, where)


def _exists(aws: api.Aws, bucket: str) -> bool:
    """Whether the bucket is there and this account's (HeadBucket, with the owner expected)."""
    try:
        s3.client(aws).head_bucket(Bucket=bucket)
    except api.ClientError as exc:
        code = api.error_code(exc)
        if code in ("404", "NoSuchBucket", "NotFound"):
            return False
        if code in ("403", *s3.DENIED):
            raise BadInput(f"S3 bucket {bucket} is not this account's ({aws.account}), or these credentials may "
                           f"not read it: gpuprov keeps no state in another account's bucket; name another "
                           f"({POLICY_DOC} says what an operator needs)") from None
        raise
    return True


def _kms_key_of_this_account(aws: api.Aws, key: str) -> None:
    try:
        found = aws.client("kms").describe_key(KeyId=key)["KeyMetadata"]
    except api.ClientError as exc:
        raise BadInput(f"--kms-key {key}: KMS says {api.error_code(exc)}; name a key of this account "
                       f"({aws.account}) in {aws.region}") from None
    if found.get("AWSAccountId") != aws.account or found.get("KeyState") != "Enabled":
        raise BadInput(f"--kms-key {key}: the key is {found.get('KeyState')}, of account "
                       f"{found.get('AWSAccountId')}; name an enabled key of this account ({aws.account})")


def problems(aws: api.Aws, bucket: str) -> list[str]:
    """What the bucket lacks of what the state needs (empty: fit)."""
    if not _exists(aws, bucket):
        return [f"it does not exist (`gpuprov state bucket s3://{bucket}/PREFIX` makes one)"]
    out = [line.split(": ", 1)[1] for line in s3_named.inspect(aws, bucket)
           if "warning:" in line or "not checked" in line]
    try:
        status = s3.client(aws).get_bucket_versioning(Bucket=bucket).get("Status")
    except api.ClientError as exc:
        status = f"not checked ({api.error_code(exc)})"
    if status != "Enabled":
        out.append(f"versioning is {status or 'off'} (a bad write could not be undone)")
    return [line.replace("; gpuprov changes nothing", "") for line in out]


def refuse_unfit(aws: api.Aws, bucket: str) -> None:
    found = problems(aws, bucket)
    if found:
        raise BadInput(f"S3 bucket {bucket} is not fit for gpuprov's state: {'; '.join(found)}; gpuprov changes "
                       "nothing in a bucket it did not make: set these, or name another bucket")


def checked(aws: api.Aws, where: S3Location) -> None:
    """Before the first record is read from a bucket, from this state directory (and again a day
    later): its owner and settings (``refuse_unfit``). Every call passes the owner anyway."""
    mine = _seen().get(where.bucket)
    if isinstance(mine, dict) and mine.get("account") == aws.account and time.time() - mine.get("when", 0) < RECHECK_S:
        return
    refuse_unfit(aws, where.bucket)
    _record_checked(aws, where)


def _record_checked(aws: api.Aws, where: S3Location) -> None:
    path, seen = paths.home() / CHECKED_FILE, _seen()
    seen[where.bucket] = {"account": aws.account, "when": time.time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(seen, sort_keys=True) + "\n")
    tmp.replace(path)


def _seen() -> dict[str, Any]:
    try:
        seen = json.loads((paths.home() / CHECKED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return seen if isinstance(seen, dict) else {}
