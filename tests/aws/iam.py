"""Test helper: docs/aws-iam-policy.json evaluated against the EC2 calls gpuprov made.

Not AWS's evaluator: a small one for the policy's own shape (Allow statements;
Action and Resource globs; StringEquals, StringLike, Bool and Null conditions, whose
values may be policy variables such as ``${aws:PrincipalAccount}``, resolved from the
request context, and never matching where the context lacks them; anything else
fails loudly). S3 requests carry ``s3_context``: the bucket owner's account
(s3:ResourceAccount) and the caller's (aws:PrincipalAccount). Each call the shim logged becomes the
authorizations EC2 makes for it: one per resource the action touches, with the
request context IAM sees (aws:RequestTag from TagSpecifications,
ec2:MetadataHttpTokens, ec2:Encrypted, and the implicit ec2:CreateTags with
ec2:CreateAction for tags given at creation). Resources gpuprov acts on but did
not create in the same call carry aws:ResourceTag/gpuprov:cluster: gpuprov
finds them by that tag or made them with it (which these same authorizations
require of every create call).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from tests.aws.moto_shim import MUTATING_PREFIXES, Call

ACCOUNT = "123456789012"
TAG = "gpuprov:cluster"
RESOURCE_TAG = f"aws:ResourceTag/{TAG}"
REQUEST_TAG = f"aws:RequestTag/{TAG}"
# Baked images carry the lock's tag instead of a cluster's (they outlive clusters).
LOCK_TAG = "gpuprov:lock"
LOCK_RESOURCE_TAG = f"aws:ResourceTag/{LOCK_TAG}"
LOCK_REQUEST_TAG = f"aws:RequestTag/{LOCK_TAG}"


def s3_context(owner: str = ACCOUNT) -> dict[str, str]:
    """What IAM sees of an S3 request by these credentials on a bucket ``owner`` owns."""
    return {"s3:ResourceAccount": owner, "aws:PrincipalAccount": ACCOUNT}


@dataclass
class Authorization:
    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.action} on {self.resource} with {self.context}"


def arn(kind: str, ident: str, region: str = "us-east-1") -> str:
    if kind in ("image", "snapshot"):  # (their ARNs name no account)
        return f"arn:aws:ec2:{region}::{kind}/{ident}"
    return f"arn:aws:ec2:{region}:{ACCOUNT}:{kind}/{ident}"


def _indexed(params: dict[str, str], pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return [v for k, v in sorted(params.items()) if rx.fullmatch(k)]


def request_tags(params: dict[str, str]) -> dict[str, dict[str, str]]:
    """{resource type: {tag key: value}} from TagSpecification.N.*"""
    out: dict[str, dict[str, str]] = {}
    for key, kind in params.items():
        found = re.fullmatch(r"TagSpecification\.(\d+)\.ResourceType", key)
        if not found:
            continue
        n = found.group(1)
        tags = out.setdefault(kind, {})
        for tkey, tval in params.items():
            m = re.fullmatch(rf"TagSpecification\.{n}\.Tag\.(\d+)\.Key", tkey)
            if m:
                tags[tval] = params.get(f"TagSpecification.{n}.Tag.{m.group(1)}.Value", "")
    return out


def _tag_context(tags: dict[str, str]) -> dict[str, str]:
    return {f"aws:RequestTag/{k}": v for k, v in tags.items()}


def authorizations(call: Call, cluster: str) -> list[Authorization]:
    """What EC2 authorizes for one logged call."""
    p, action = call.params, f"ec2:{call.action}"
    owned = {RESOURCE_TAG: cluster}  # see the module docstring
    tags = request_tags(p)
    out: list[Authorization] = []

    def created(kind: str, ident: str, extra: dict[str, str] | None = None) -> None:
        ctx = {**_tag_context(tags.get(kind, {})), **(extra or {})}
        out.append(Authorization(action, arn(kind, ident), ctx))
        if kind in tags:  # tags given at creation: an implicit CreateTags
            out.append(Authorization("ec2:CreateTags", arn(kind, ident),
                                     {**_tag_context(tags[kind]), "ec2:CreateAction": call.action}))

    def used(kind: str, ident: str, tagged: bool = True) -> None:
        out.append(Authorization(action, arn(kind, ident), dict(owned) if tagged else {}))

    name = call.action
    if name == "RunInstances":
        created("instance", "*", {"ec2:MetadataHttpTokens": p.get("MetadataOptions.HttpTokens", "optional")})
        encrypted = _indexed(p, r"BlockDeviceMapping\.\d+\.Ebs\.Encrypted") or ["false"]
        created("volume", "*", {"ec2:Encrypted": "true" if all(v == "true" for v in encrypted) else "false"})
        created("network-interface", "*")
        if p.get("InstanceMarketOptions.MarketType") == "spot":
            created("spot-instances-request", "*")
        used("image", p["ImageId"], tagged=False)
        for subnet in _indexed(p, r"NetworkInterface\.\d+\.SubnetId") or _indexed(p, r"SubnetId"):
            used("subnet", subnet, tagged=False)
        for group in set(_indexed(p, r"NetworkInterface\.\d+\.SecurityGroupId\.\d+") + _indexed(p, r"SecurityGroupId\.\d+")):
            used("security-group", group)
        if p.get("KeyName"):
            used("key-pair", p["KeyName"])
        if p.get("Placement.GroupName"):
            used("placement-group", p["Placement.GroupName"])
        reservation = p.get("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
        if reservation:
            used("capacity-reservation", reservation, tagged=False)
    elif name == "ImportKeyPair":
        created("key-pair", p["KeyName"])
    elif name == "CreateSecurityGroup":
        created("security-group", "*")
        used("vpc", p.get("VpcId", "vpc-default"), tagged=False)
    elif name == "CreatePlacementGroup":
        created("placement-group", p["GroupName"])
    elif name == "AllocateAddress":
        created("elastic-ip", "*")
    elif name == "CreateTags":  # standalone: no ec2:CreateAction in its context
        for ident in _indexed(p, r"ResourceId\.\d+"):
            ctx = {f"aws:RequestTag/{k}": v for k, v in zip(_indexed(p, r"Tag\.\d+\.Key"),
                                                             _indexed(p, r"Tag\.\d+\.Value"), strict=False)}
            out.append(Authorization(action, arn("instance", ident), {**owned, **ctx}))
    elif name == "StopInstances":
        for ident in _indexed(p, r"InstanceId\.\d+"):
            used("instance", ident)
    elif name == "CreateImage":
        used("instance", p["InstanceId"])
        created("image", "*")
        created("snapshot", "*")
    elif name == "CopyImage":
        # The source image is authorized with the request's tags: an image/* resource pattern
        # cannot tell the source from the copy, so the policy asks the lock tag of the request
        # (copying an image of the account is then allowed only into a copy tagged with a lock).
        source = _tag_context(tags.get("image", {}))
        out.append(Authorization(action, arn("image", p["SourceImageId"], p.get("SourceRegion", "us-east-1")), source))
        created("image", "*")
        created("snapshot", "*")
    elif name in ("DeregisterImage", "DeleteSnapshot"):
        kind, key = ("image", "ImageId") if name == "DeregisterImage" else ("snapshot", "SnapshotId")
        out.append(Authorization(action, arn(kind, p[key]), {LOCK_RESOURCE_TAG: "*"}))
    elif name == "TerminateInstances":
        for ident in _indexed(p, r"InstanceId\.\d+"):
            used("instance", ident)
    elif name in ("AuthorizeSecurityGroupIngress", "RevokeSecurityGroupIngress", "DeleteSecurityGroup"):
        used("security-group", p["GroupId"])
    elif name in ("DeleteKeyPair",):
        used("key-pair", p["KeyName"])
    elif name == "DeletePlacementGroup":
        used("placement-group", p["GroupName"])
    elif name == "AssociateAddress":
        used("elastic-ip", p["AllocationId"])
        if p.get("NetworkInterfaceId"):
            used("network-interface", p["NetworkInterfaceId"])
        if p.get("InstanceId"):
            used("instance", p["InstanceId"])
    elif name == "DisassociateAddress":
        used("elastic-ip", p.get("AssociationId", "*"))
    elif name == "ReleaseAddress":
        used("elastic-ip", p["AllocationId"])
    else:
        raise AssertionError(f"iam.py does not know what EC2 authorizes for {name}; teach it")
    return out


def iam_arn(kind: str, name: str, path: str = "/gpuprov/") -> str:
    return f"arn:aws:iam::{ACCOUNT}:{kind}{path}{name}"


def setup_authorizations(call: Call, cluster: str) -> list[Authorization]:
    """What EC2 and IAM authorize for one call of an elastic cluster's set-up
    (gpuprov/providers/aws/power_setup.py), reads included: each IAM read needs a permission of
    its own. gpuprov puts every role and profile under the path /gpuprov/; those it acts on but
    did not create in the call carry the cluster's tag (it made them with it, or refuses them)."""
    p, owned = call.params, {RESOURCE_TAG: cluster}
    if call.service == "sts":
        return []  # GetCallerIdentity needs no permission
    if call.service == "ec2":
        action = f"ec2:{call.action}"
        if call.action == "CreateLaunchTemplate":
            ctx = _tag_context(request_tags(p).get("launch-template", {}))
            return [Authorization(action, arn("launch-template", "*"), ctx),
                    Authorization("ec2:CreateTags", arn("launch-template", "*"), {**ctx, "ec2:CreateAction": call.action})]
        if call.action == "DeleteLaunchTemplate":
            return [Authorization(action, arn("launch-template", p.get("LaunchTemplateId", "*")), owned)]
        if call.action == "AssociateIamInstanceProfile":
            return [Authorization(action, arn("instance", p["InstanceId"]), owned),
                    Authorization("iam:PassRole", iam_arn("role", p["IamInstanceProfile.Name"]),
                                  {"iam:PassedToService": "ec2.amazonaws.com"})]
        if call.action.startswith("Describe"):
            return [Authorization(action, "*")]
        return authorizations(call, cluster)
    assert call.service == "iam", call
    action, name = f"iam:{call.action}", p.get("RoleName") or p.get("InstanceProfileName", "")
    tags = {p[k]: p.get(k[:-3] + "Value", "") for k in p if re.fullmatch(r"Tags\.member\.\d+\.Key", k)}
    requested = _tag_context(tags)
    if call.action == "GetPolicy":
        return [Authorization(action, p["PolicyArn"])]
    if call.action in ("CreateRole", "CreateInstanceProfile"):
        kind = "role" if call.action == "CreateRole" else "instance-profile"
        tag_action = "iam:TagRole" if kind == "role" else "iam:TagInstanceProfile"
        resource = iam_arn(kind, name, p.get("Path", "/"))
        return [Authorization(action, resource, requested)] + (
            [Authorization(tag_action, resource, requested)] if tags else [])
    if call.action in ("GetRole", "ListAttachedRolePolicies", "ListRolePolicies"):
        return [Authorization(action, iam_arn("role", name))]
    if call.action == "GetInstanceProfile":
        return [Authorization(action, iam_arn("instance-profile", name))]
    if call.action in ("AttachRolePolicy", "DetachRolePolicy"):
        return [Authorization(action, iam_arn("role", name), {**owned, "iam:PolicyARN": p["PolicyArn"]})]
    if call.action == "DeleteRole":
        return [Authorization(action, iam_arn("role", name), owned)]
    if call.action in ("AddRoleToInstanceProfile", "RemoveRoleFromInstanceProfile", "DeleteInstanceProfile"):
        out = [Authorization(action, iam_arn("instance-profile", p["InstanceProfileName"]), owned)]
        if call.action == "AddRoleToInstanceProfile":  # IAM asks PassRole, with no service in its context
            out.append(Authorization("iam:PassRole", iam_arn("role", p["RoleName"])))
        return out
    raise AssertionError(f"iam.py does not know what IAM authorizes for {call.action}; teach it")


def mutating(calls: list[Call]) -> list[Call]:
    """Every mutating EC2 call, DryRun ones included (they ask for the same permission)."""
    return [c for c in calls if c.service == "ec2" and c.action.startswith(MUTATING_PREFIXES)]


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _resolve(value: str, ctx: dict[str, str]) -> str | None:
    """A condition value with its policy variable (``${key}``, the whole value) replaced from
    the request context; None where the context lacks it (IAM: the condition does not match)."""
    found = re.fullmatch(r"\$\{([^}]+)\}", value)
    return value if found is None else ctx.get(found.group(1))


def _condition_holds(condition: dict[str, dict[str, Any]], ctx: dict[str, str]) -> bool:
    for operator, tests in condition.items():
        for key, wanted in tests.items():
            values = [v for v in (_resolve(str(w), ctx) for w in _as_list(wanted)) if v is not None]
            if not values:
                return False
            have = ctx.get(key)
            if operator == "Null":
                if (values[0] == "true") != (have is None):
                    return False
            elif operator == "StringEquals":
                if have is None or have not in values:
                    return False
            elif operator == "StringLike":
                if have is None or not any(fnmatch.fnmatchcase(have, v) for v in values):
                    return False
            elif operator == "Bool":
                if have is None or have.lower() != values[0].lower():
                    return False
            else:
                raise AssertionError(f"iam.py cannot evaluate the condition operator {operator}")
    return True


def allowed_by(policy: dict[str, Any], auth: Authorization) -> list[str]:
    """The Sids of the statements that allow ``auth`` (none: refused)."""
    sids = []
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow", "iam.py evaluates Allow statements only"
        if not any(fnmatch.fnmatchcase(auth.action, a) for a in _as_list(statement["Action"])):
            continue
        if not any(fnmatch.fnmatchcase(auth.resource, r) for r in _as_list(statement["Resource"])):
            continue
        if _condition_holds(statement.get("Condition", {}), auth.context):
            sids.append(statement.get("Sid", "?"))
    return sids
