"""What an elastic cluster on AWS holds for its dynamic nodes (gpuprov.providers.aws.power_setup,
issue 56), against the emulated EC2 and IAM (moto behind the shim): the launch template, the
controller's role with the account's managed power policy alone, its instance profile on the
controller's instance; made once, found again, never another cluster's, removed with the
cluster; and every call allowed by the operator's policy (docs/aws-iam-policy.json), none of
them able to give a role more than the power policy."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.providers.aws import api, power_setup
from tests.aws import iam
from tests.aws.conftest import MOTO_AMI, REGION, ROOT_POLICY
from tests.conftest import ROOT

CLUSTER = "train"
POWER_POLICY = (ROOT / "docs" / "aws-iam-policy-power.json").read_text()
OPERATOR = json.loads(ROOT_POLICY.read_text())


@pytest.fixture
def aws(shim) -> api.Aws:
    return api.connect(REGION)


@pytest.fixture
def managed(aws) -> str:
    """The managed policy an administrator makes once from docs/aws-iam-policy-power.json."""
    return str(aws.client("iam").create_policy(PolicyName=power_setup.MANAGED_POLICY,
                                               PolicyDocument=POWER_POLICY)["Policy"]["Arn"])


@pytest.fixture
def template(aws, shim) -> power_setup.Template:
    group = aws.ec2.create_security_group(
        GroupName=f"gpuprov-{CLUSTER}", Description="gpuprov",
        TagSpecifications=[{"ResourceType": "security-group", "Tags": [{"Key": "gpuprov:cluster", "Value": CLUSTER}]}])
    shim.calls.clear()
    return power_setup.Template("p4d.24xlarge", group["GroupId"], "/dev/sda1", 300)


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags") or []}


def test_ensure_makes_the_template_role_and_profile_once(aws, shim, managed, template) -> None:
    said: list[str] = []
    made = power_setup.ensure(aws, CLUSTER, template, said.append)
    name = f"gpuprov-{CLUSTER}-{REGION}-power"
    assert made == power_setup.Made(made.template, name, name)
    (held,) = aws.ec2.describe_launch_templates(LaunchTemplateIds=[made.template])["LaunchTemplates"]
    assert held["LaunchTemplateName"] == f"gpuprov-{CLUSTER}-dynamic" and _tags(held) == {"gpuprov:cluster": CLUSTER}
    data = aws.ec2.describe_launch_template_versions(
        LaunchTemplateId=made.template)["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    assert data["InstanceType"] == "p4d.24xlarge" and data["SecurityGroupIds"] == [template.security_group]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["BlockDeviceMappings"][0]["Ebs"] == {"VolumeSize": 300, "VolumeType": "gp3", "Encrypted": True,
                                                     "DeleteOnTermination": True}
    assert "KeyName" not in data and "UserData" not in data and "ImageId" not in data
    client = aws.client("iam")
    role = client.get_role(RoleName=name)["Role"]
    assert role["Path"] == "/gpuprov/" and _tags(role) == {"gpuprov:cluster": CLUSTER}
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust == power_setup.TRUST
    assert [p["PolicyArn"] for p in client.list_attached_role_policies(RoleName=name)["AttachedPolicies"]] == [managed]
    assert client.list_role_policies(RoleName=name)["PolicyNames"] == []  # nothing inline
    profile = client.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [name] and _tags(profile) == {"gpuprov:cluster": CLUSTER}
    assert sorted(power_setup.found(aws, CLUSTER)) == sorted(
        [f"launch template gpuprov-{CLUSTER}-dynamic", f"role {name}", f"instance profile {name}"])
    # Again: found, nothing made twice, nothing said.
    shim.calls.clear()
    again: list[str] = []
    assert power_setup.ensure(aws, CLUSTER, template, again.append) == made and again == []
    assert not [c.action for c in shim.calls if c.action.startswith(("Create", "Attach", "Add"))]
    assert len(said) == 4, said


def test_without_the_managed_policy_nothing_is_made(aws, shim, template) -> None:
    with pytest.raises(GpuprovError, match=re.escape("the managed policy gpuprov-power is not in account 123456789012: "
                                                     "an administrator makes it once from docs/aws-iam-policy-power.json")):
        power_setup.ensure(aws, CLUSTER, template, print)
    assert power_setup.found(aws, CLUSTER) == []
    assert [c.action for c in shim.calls if c.action.startswith("Create")] == []


def test_another_clusters_resources_of_the_same_name_are_never_used(aws, shim, managed, template) -> None:
    client, name = aws.client("iam"), f"gpuprov-{CLUSTER}-{REGION}-power"
    client.create_role(RoleName=name, Path="/gpuprov/", AssumeRolePolicyDocument=json.dumps(power_setup.TRUST),
                       Tags=[{"Key": "gpuprov:cluster", "Value": "other"}])
    with pytest.raises(GpuprovError, match=f"role {name} exists and is cluster other's, not train's"):
        power_setup.ensure(aws, CLUSTER, template, print)
    assert power_setup.found(aws, CLUSTER) == []  # refused before anything was made
    assert client.list_attached_role_policies(RoleName=name)["AttachedPolicies"] == []
    client.delete_role(RoleName=name)
    aws.ec2.create_launch_template(LaunchTemplateName=f"gpuprov-{CLUSTER}-dynamic",
                                   LaunchTemplateData={"InstanceType": "t3.micro"})
    with pytest.raises(GpuprovError, match="not tagged for a gpuprov cluster, not train's"):
        power_setup.ensure(aws, CLUSTER, template, print)
    # A role of this name holding another policy is not given the power policy beside it.
    aws.ec2.delete_launch_template(LaunchTemplateName=f"gpuprov-{CLUSTER}-dynamic")
    client.create_role(RoleName=name, Path="/gpuprov/", AssumeRolePolicyDocument=json.dumps(power_setup.TRUST),
                       Tags=[{"Key": "gpuprov:cluster", "Value": CLUSTER}])
    admin = client.create_policy(PolicyName="admin", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))["Policy"]["Arn"]
    client.attach_role_policy(RoleName=name, PolicyArn=admin)
    with pytest.raises(GpuprovError, match=f"role {name} holds other policies .*admin.*: gpuprov gives it gpuprov-power alone"):
        power_setup.ensure(aws, CLUSTER, template, print)
    assert [p["PolicyArn"] for p in client.list_attached_role_policies(RoleName=name)["AttachedPolicies"]] == [admin]


def test_the_profile_goes_on_the_controller_once_and_remove_leaves_nothing(aws, shim, managed, template) -> None:
    made = power_setup.ensure(aws, CLUSTER, template, print)
    controller = aws.ec2.run_instances(ImageId=MOTO_AMI, MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "gpuprov:cluster", "Value": CLUSTER}]}])["Instances"][0]["InstanceId"]
    said: list[str] = []
    power_setup.associate(aws, controller, made.profile, said.append)
    power_setup.associate(aws, controller, made.profile, said.append)
    (held,) = aws.ec2.describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [controller]}])["IamInstanceProfileAssociations"]
    assert held["IamInstanceProfile"]["Arn"].endswith(f"/gpuprov/{made.profile}") and len(said) == 1
    # Another cluster's resources of its own are left.
    other = power_setup.ensure(aws, "other", template, print)
    removed: list[str] = []
    power_setup.remove(aws, CLUSTER, removed.append)
    assert power_setup.found(aws, CLUSTER) == []
    assert len(removed) == 3, removed
    assert len(power_setup.found(aws, "other")) == 3 and other.role.startswith("gpuprov-other-")
    power_setup.remove(aws, CLUSTER, removed.append)  # nothing left: nothing to do
    assert len(removed) == 3
    assert aws.client("iam").get_policy(PolicyArn=managed)["Policy"]["PolicyName"] == "gpuprov-power"


def test_the_operators_policy_allows_each_call_and_no_other_policy_on_a_role(aws, shim, managed, template) -> None:
    made = power_setup.ensure(aws, CLUSTER, template, print)
    controller = aws.ec2.run_instances(ImageId=MOTO_AMI, MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "gpuprov:cluster", "Value": CLUSTER}]}])["Instances"][0]["InstanceId"]
    shim.calls.clear()
    power_setup.remove(aws, CLUSTER, print)
    power_setup.ensure(aws, CLUSTER, template, print)
    power_setup.associate(aws, controller, made.profile, print)
    context = {"aws:PrincipalAccount": iam.ACCOUNT}
    auths = [a for c in shim.calls for a in iam.setup_authorizations(c, CLUSTER)]
    assert {a.action for a in auths} >= {"ec2:CreateLaunchTemplate", "ec2:DeleteLaunchTemplate", "iam:CreateRole",
                                         "iam:AttachRolePolicy", "iam:PassRole", "ec2:AssociateIamInstanceProfile",
                                         "iam:DeleteRole", "iam:DeleteInstanceProfile"}
    refused = [str(a) for a in auths if not iam.allowed_by(OPERATOR, iam.Authorization(
        a.action, a.resource, {**context, **a.context}))]
    assert refused == []
    role = f"arn:aws:iam::{iam.ACCOUNT}:role/gpuprov/gpuprov-{CLUSTER}-{REGION}-power"
    tagged = {"aws:RequestTag/gpuprov:cluster": CLUSTER, **context}
    never = [
        iam.Authorization("iam:AttachRolePolicy", role, {"iam:PolicyARN": "arn:aws:iam::aws:policy/AdministratorAccess"}),
        iam.Authorization("iam:AttachRolePolicy", role, {"iam:PolicyARN": f"arn:aws:iam::{iam.ACCOUNT}:policy/admin"}),
        iam.Authorization("iam:PutRolePolicy", role, {}),
        iam.Authorization("iam:CreateRole", f"arn:aws:iam::{iam.ACCOUNT}:role/admin", tagged),
        iam.Authorization("iam:CreateRole", role, context),  # untagged
        iam.Authorization("iam:PassRole", f"arn:aws:iam::{iam.ACCOUNT}:role/admin",
                          {"iam:PassedToService": "ec2.amazonaws.com"}),
        iam.Authorization("iam:UpdateAssumeRolePolicy", role, {}),
        iam.Authorization("iam:DeleteRole", role, {}),  # a role not tagged by gpuprov
        iam.Authorization("ec2:DeleteLaunchTemplate", iam.arn("launch-template", "lt-0abc"), {}),
    ]
    assert [str(a) for a in never if iam.allowed_by(OPERATOR, iam.Authorization(
        a.action, a.resource, {**context, **a.context}))] == []
