"""What an elastic cluster on AWS holds beside its nodes, for its dynamic nodes (issue 56): made
once for the cluster, found by its tag or its name, removed with it.

- **The launch template** ``gpuprov-NAME-dynamic``, tagged for the cluster: the dynamic nodes'
  instance type, the cluster's security group, IMDSv2 required, the encrypted root volume.
  No key pair (a node's SSH keys come with the user-data of its own resume), no image (each
  resume names the newest image baked for the lock), no user-data: what the power service
  adds per node. The power policy lets a launch use only a template tagged for the role's
  cluster.
- **The controller's role** ``gpuprov-NAME-REGION-power`` under the path ``/gpuprov/``, tagged
  ``gpuprov:cluster=NAME`` (the power policy reads it as ``${aws:PrincipalTag/gpuprov:cluster}``),
  trusted by EC2 alone, with one policy attached: the account's managed policy
  ``gpuprov-power``, made once by an administrator from docs/aws-iam-policy-power.json. gpuprov
  writes no policy of its own: the operator's rights (docs/aws-iam-policy.json) let it attach that
  one policy and no other, so a role made by gpuprov can never hold more than the power policy.
  IAM is global: the region in the role's name keeps two regions' clusters of one name apart.
- **Its instance profile**, of the same name and path, holding the role, associated with the
  controller's instance: the service on the controller (gpuprov.slurm.power_aws_node) calls
  EC2 with its credentials.

A resource of that name that carries another cluster's tag (or none) is never used or
changed: refused with what it is. ``remove`` deletes what carries this cluster's tag only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles, Reporter
from gpuprov.providers.aws import api, power, preflight
from gpuprov.providers.aws.common import DEFAULT_DISK_GB, TAG, tag_specs, update_record
from gpuprov.providers.aws.resources import default_subnets
from gpuprov.state import NodeRecord

PATH = "/gpuprov/"
MANAGED_POLICY = "gpuprov-power"
POLICY_DOC = "docs/aws-iam-policy-power.json"
TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}


def template_name(cluster: str) -> str:
    return f"gpuprov-{cluster}-dynamic"


def role_name(cluster: str, region: str) -> str:
    """At most 64 characters (IAM's limit): 8 + 32 (the longest cluster name) + 1 + 15 + 6."""
    return f"gpuprov-{cluster}-{region}-power"


def policy_arn(account: str) -> str:
    return f"arn:aws:iam::{account}:policy/{MANAGED_POLICY}"


@dataclass(frozen=True)
class Made:
    """What the cluster's dynamic nodes and its controller use."""

    template: str  # the launch template's id
    role: str
    profile: str  # the instance profile's name (the role's)


@dataclass(frozen=True)
class Template:
    """The dynamic nodes' launch template's data."""

    instance_type: str
    security_group: str
    root_device: str
    disk_gb: int = DEFAULT_DISK_GB
    # EFA interfaces per node (power.Plan.efa_cards): then the group goes on each interface at the
    # launch, not in the template (EC2 refuses both in one launch).
    efa_cards: int = 0

    def data(self) -> dict[str, Any]:
        return {
            "InstanceType": self.instance_type,
            **({} if self.efa_cards else {"SecurityGroupIds": [self.security_group]}),
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"},
            "BlockDeviceMappings": [{"DeviceName": self.root_device, "Ebs": {
                "VolumeSize": self.disk_gb, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
        }


def _tags_of(resource: dict[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t["Value"]) for t in resource.get("Tags") or []}


def _owned(what: str, tags: dict[str, str], cluster: str) -> None:
    if tags.get(TAG) != cluster:
        owner = f"cluster {tags[TAG]}'s" if tags.get(TAG) else "not tagged for a gpuprov cluster"
        raise GpuprovError(f"{what} exists and is {owner}, not {cluster}'s: gpuprov neither uses nor "
                           "changes it; remove or rename it, or choose another cluster name")


def ensure(aws: api.Aws, cluster: str, template: Template, report: Reporter) -> Made:
    """The cluster's launch template, role and instance profile: each found one checked to be
    this cluster's first (module docstring), then what is missing made. The managed policy must
    exist. A refusal changes nothing."""
    arn, iam = policy_arn(aws.account), aws.client("iam")
    if _get(iam.get_policy, "Policy", PolicyArn=arn) is None:
        raise GpuprovError(f"the managed policy {MANAGED_POLICY} is not in account {aws.account}: an "
                           f"administrator makes it once from {POLICY_DOC} (`aws iam create-policy "
                           f"--policy-name {MANAGED_POLICY} --policy-document file://{POLICY_DOC}`)")
    held = _held(aws, cluster, arn)
    made = Made(held.template or _make_template(aws, cluster, template, report), held.role, held.role)
    tags = [{"Key": TAG, "Value": cluster}]
    if not held.has_role:
        iam.create_role(RoleName=made.role, Path=PATH, AssumeRolePolicyDocument=json.dumps(TRUST), Tags=tags,
                        Description=f"gpuprov: the power service of cluster {cluster} ({aws.region})")
        report(f"role {made.role}: trusted by EC2, tagged {TAG}={cluster}")
    if not held.has_policy:
        iam.attach_role_policy(RoleName=made.role, PolicyArn=arn)
        report(f"role {made.role}: {MANAGED_POLICY} attached")
    if not held.has_profile:
        iam.create_instance_profile(InstanceProfileName=made.profile, Path=PATH, Tags=tags)
        report(f"instance profile {made.profile}")
    if not held.profile_has_role:
        iam.add_role_to_instance_profile(InstanceProfileName=made.profile, RoleName=made.role)
    return made


@dataclass(frozen=True)
class _Held:
    template: str
    role: str
    has_role: bool
    has_policy: bool
    has_profile: bool
    profile_has_role: bool


def _held(aws: api.Aws, cluster: str, arn: str) -> _Held:
    """What of the cluster's exists, each checked to be its own (GpuprovError: nothing changed)."""
    iam, name, tname = aws.client("iam"), role_name(cluster, aws.region), template_name(cluster)
    template = ""
    try:
        found_template = aws.ec2.describe_launch_templates(LaunchTemplateNames=[tname])["LaunchTemplates"][0]
    except api.ClientError as exc:
        if not api.error_code(exc).startswith("InvalidLaunchTemplateName.NotFound"):
            raise
    else:
        template = str(found_template["LaunchTemplateId"])
        _owned(f"launch template {tname} ({template})", _tags_of(found_template), cluster)
    role = _get(iam.get_role, "Role", RoleName=name)
    attached: list[str] = []
    if role is not None:
        _owned(f"role {name}", _tags_of(role), cluster)
        attached = [p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]]
        others = [a for a in attached if a != arn]
        if others:
            raise GpuprovError(f"role {name} holds other policies ({', '.join(others)}): gpuprov gives it "
                               f"{MANAGED_POLICY} alone; detach them")
    profile = _get(iam.get_instance_profile, "InstanceProfile", InstanceProfileName=name)
    roles: list[str] = []
    if profile is not None:
        _owned(f"instance profile {name}", _tags_of(profile), cluster)
        roles = [r["RoleName"] for r in profile.get("Roles") or []]
        if roles and roles != [name]:
            raise GpuprovError(f"instance profile {name} holds role {roles[0]}, not {name}")
    return _Held(template, name, role is not None, bool(attached), profile is not None, bool(roles))


def _make_template(aws: api.Aws, cluster: str, template: Template, report: Reporter) -> str:
    name = template_name(cluster)
    made = aws.ec2.create_launch_template(
        LaunchTemplateName=name, LaunchTemplateData=template.data(),
        VersionDescription=f"gpuprov: the dynamic nodes of {cluster}",
        TagSpecifications=tag_specs(cluster, "launch-template"))["LaunchTemplate"]
    report(f"launch template {name} ({made['LaunchTemplateId']}): {template.instance_type}, IMDSv2 required, "
           f"{template.disk_gb} GB encrypted")
    return str(made["LaunchTemplateId"])


def _get(get: Any, key: str, **name: str) -> dict[str, Any] | None:
    """An IAM entity as IAM describes it; None where there is none of that name."""
    try:
        return dict(get(**name)[key])
    except api.ClientError as exc:
        if api.error_code(exc) != "NoSuchEntity":
            raise
        return None


def associate(aws: api.Aws, instance: str, profile: str, report: Reporter) -> None:
    """The profile on the controller's instance (once: an instance holds one profile)."""
    found = aws.ec2.describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [instance]}])["IamInstanceProfileAssociations"]
    live = [a for a in found if a.get("State") in ("associating", "associated")]
    if any(a["IamInstanceProfile"]["Arn"].endswith(f"/{profile}") for a in live):
        return
    if live:
        raise GpuprovError(f"{instance} already holds instance profile {live[0]['IamInstanceProfile']['Arn']}: "
                           f"gpuprov does not replace it with {profile}")
    aws.ec2.associate_iam_instance_profile(IamInstanceProfile={"Name": profile}, InstanceId=instance)
    report(f"{instance}: instance profile {profile} (the power service's rights)")


def cluster_group(aws: api.Aws, cluster: str) -> str:
    """The cluster's security group (the one `up` made, tagged for it): the dynamic nodes'."""
    groups = aws.ec2.describe_security_groups(Filters=[{"Name": f"tag:{TAG}", "Values": [cluster]}])["SecurityGroups"]
    if len(groups) != 1:
        raise GpuprovError(f"cluster {cluster}: expected its one security group tagged {TAG}={cluster}, "
                           f"found {len(groups)}")
    return str(groups[0]["GroupId"])


def found(aws: api.Aws, cluster: str) -> list[str]:
    """What of the above exists for ``cluster`` (its tag on each), for `down` and orphans."""
    out = [f"launch template {t['LaunchTemplateName']}" for t in _templates(aws, cluster)]
    name, iam = role_name(cluster, aws.region), aws.client("iam")
    for kind, held in (("role", _get(iam.get_role, "Role", RoleName=name)),
                       ("instance profile", _get(iam.get_instance_profile, "InstanceProfile",
                                                 InstanceProfileName=name))):
        if held is not None and _tags_of(held).get(TAG) == cluster:
            out.append(f"{kind} {name}")
    return out


def _templates(aws: api.Aws, cluster: str) -> list[dict[str, Any]]:
    return list(aws.ec2.describe_launch_templates(
        Filters=[{"Name": f"tag:{TAG}", "Values": [cluster]}])["LaunchTemplates"])


def remove(aws: api.Aws, cluster: str, report: Reporter) -> None:
    """The cluster's launch templates, and its role and profile where tagged for it: after its
    instances are gone (a profile in use by a live instance is still removed; the instance
    loses the rights)."""
    remove_templates(aws, cluster, report)
    remove_access(aws, cluster, report)


def remove_templates(aws: api.Aws, cluster: str, report: Reporter) -> bool:
    """The cluster's launch templates deleted (`down` does this first: the power policy launches
    from them alone, so no dynamic node starts while the cluster goes); whether there were any."""
    held = _templates(aws, cluster)
    for template in held:
        aws.ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])
        report(f"launch template {template['LaunchTemplateName']} deleted")
    return bool(held)


def remove_access(aws: api.Aws, cluster: str, report: Reporter) -> None:
    """The controller's instance profile and role, where tagged for ``cluster``."""
    there = found(aws, cluster)
    name, iam = role_name(cluster, aws.region), aws.client("iam")
    if f"instance profile {name}" in there:
        profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        for role in profile.get("Roles") or []:
            iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=role["RoleName"])
        iam.delete_instance_profile(InstanceProfileName=name)
        report(f"instance profile {name} deleted")
    if f"role {name}" in there:
        for policy in iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]:
            iam.detach_role_policy(RoleName=name, PolicyArn=policy["PolicyArn"])
        iam.delete_role(RoleName=name)
        report(f"role {name} deleted")


def prepare(cluster: str, controller: NodeRecord, like: NodeRecord, image: str, disk_gb: int | None,
            files: ClusterFiles, report: Reporter) -> tuple[Made, power.Plan]:
    """What an elastic cluster's controller needs of EC2 and IAM, made where missing (`up`/
    `provision --max-count` on aws, before the slurm play): the launch template of
    ``instance_type`` in the cluster's group, with the root device of ``image``; the role and
    profile (ensure); the profile on the controller's instance; the cluster's record saying so
    (`down` removes them). Returns what was made and the service's power.Plan: the template, the
    image, the zones' default subnets with the controller's zone first, on a type with EFA one EFA
    interface per network card in the cluster's group, and in the zone of ``like`` (the node the
    dynamic nodes are made like) its cluster placement group, as its static nodes have."""
    aws = api.connect(str(controller.extra.get("region") or "") or None)
    found = aws.ec2.describe_images(ImageIds=[image])["Images"]
    if not found:
        raise GpuprovError(f"{cluster}: image {image} for its dynamic nodes is gone (deregistered)")
    instance_type = like.instance_type
    itype = preflight.facts(aws, instance_type)
    cards = max(1, min(itype.network_cards, itype.efa_max_interfaces or 1)) if itype.efa else 0
    group = cluster_group(aws, cluster)
    made = ensure(aws, cluster, Template(instance_type, group, str(found[0].get("RootDeviceName") or "/dev/xvda"),
                                         disk_gb or DEFAULT_DISK_GB, cards), report)
    update_record(files, power=True)
    associate(aws, controller.id, made.profile, report)
    subnets = default_subnets(aws)
    order = [controller.zone, *sorted(z for z in subnets if z != controller.zone)]
    spine = str(like.extra.get("placement_group") or "")
    return made, power.Plan(cluster, made.template, image, instance_type,
                            {z: subnets[z] for z in order if z in subnets}, cards, group if cards else "",
                            {like.zone: spine} if spine else {})
