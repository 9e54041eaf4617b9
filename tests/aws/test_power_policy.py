"""docs/aws-iam-policy-power.json: the rights of an elastic AWS cluster's power service (issue 56,
docs/slurm.md "Elastic nodes on AWS"). One policy for every cluster, scoped to one by the tag of
the role that holds it (``gpuprov:cluster`` on the controller's instance profile role, read as
``${aws:PrincipalTag/gpuprov:cluster}``): launch only from the cluster's launch template, a baked
image of the account, the cluster's security group, each instance tagged for the cluster as a
dynamic node with IMDSv2; tag only at launch; terminate only the cluster's dynamic nodes.

Held here to tests/aws/iam.py's evaluator (the one the EC2 tests hold docs/aws-iam-policy.json
to), with the authorizations EC2 makes for each call (one per resource the call touches, with
the request context IAM sees): what the service asks is allowed, and each way out of the
cluster's scope is refused."""

from __future__ import annotations

import json

import pytest

from tests.aws.iam import ACCOUNT, Authorization, allowed_by, arn
from tests.conftest import ROOT

POLICY = json.loads((ROOT / "docs" / "aws-iam-policy-power.json").read_text())
CLUSTER = "train"
PRINCIPAL = {"aws:PrincipalTag/gpuprov:cluster": CLUSTER, "aws:PrincipalAccount": ACCOUNT}


def _run_instances(*, tags: dict[str, str] | None = None, tokens: str = "required",
                   template_cluster: str = CLUSTER, group_cluster: str = CLUSTER,
                   image_owner: str = ACCOUNT, image_lock: str | None = "0a1b2c3d",
                   spine_cluster: str | None = None) -> list[Authorization]:
    """What EC2 authorizes for one RunInstances of a dynamic node: its launch template, image,
    subnet and group (and, where ``spine_cluster``, a placement group tagged for that cluster),
    and the instance, volume and interface it creates with their tags."""
    tags = {"gpuprov:cluster": CLUSTER, "gpuprov:power": "dynamic"} if tags is None else tags
    request = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    image = {"ec2:Owner": image_owner} | ({"aws:ResourceTag/gpuprov:lock": image_lock} if image_lock else {})
    out = [
        Authorization("ec2:RunInstances", arn("launch-template", "lt-0123"),
                      {"aws:ResourceTag/gpuprov:cluster": template_cluster}),
        Authorization("ec2:RunInstances", arn("image", "ami-0123"), image),
        Authorization("ec2:RunInstances", arn("subnet", "subnet-0123"), {}),
        Authorization("ec2:RunInstances", arn("security-group", "sg-0123"),
                      {"aws:ResourceTag/gpuprov:cluster": group_cluster}),
        Authorization("ec2:RunInstances", arn("instance", "*"), {**request, "ec2:MetadataHttpTokens": tokens}),
        Authorization("ec2:RunInstances", arn("volume", "*"), dict(request)),
        Authorization("ec2:RunInstances", arn("network-interface", "*"), dict(request)),
        *([Authorization("ec2:RunInstances", arn("placement-group", "gpuprov-train-us-east-1a"),
                         {"aws:ResourceTag/gpuprov:cluster": spine_cluster})] if spine_cluster else []),
    ]
    out += [Authorization("ec2:CreateTags", arn(kind, "*"), {**request, "ec2:CreateAction": "RunInstances"})
            for kind in ("instance", "volume", "network-interface")]
    return out


def _refused(auths: list[Authorization]) -> list[str]:
    """Each authorization the policy does not allow, as text (IAM refuses the whole call)."""
    return [str(a) for a in auths if not allowed_by(POLICY, Authorization(a.action, a.resource,
                                                                          {**PRINCIPAL, **a.context}))]


def test_a_dynamic_node_of_the_cluster_is_launched_and_terminated() -> None:
    assert _refused(_run_instances()) == []
    assert _refused(_run_instances(spine_cluster=CLUSTER)) == []  # in the static nodes' placement group
    terminate = Authorization("ec2:TerminateInstances", arn("instance", "i-0123"),
                              {"aws:ResourceTag/gpuprov:cluster": CLUSTER, "aws:ResourceTag/gpuprov:power": "dynamic"})
    assert _refused([terminate]) == []
    assert _refused([Authorization("ec2:DescribeInstances", "*", {})]) == []


@pytest.mark.parametrize(("why", "auths"), [
    ("another cluster's tag on the instance",
     _run_instances(tags={"gpuprov:cluster": "other", "gpuprov:power": "dynamic"})),
    ("no power tag: a static node", _run_instances(tags={"gpuprov:cluster": CLUSTER})),
    ("no tags at all", _run_instances(tags={})),
    ("IMDSv1 allowed", _run_instances(tokens="optional")),
    ("another cluster's launch template", _run_instances(template_cluster="other")),
    ("another cluster's security group", _run_instances(group_cluster="other")),
    ("another cluster's placement group", _run_instances(spine_cluster="other")),
    ("an image of another account", _run_instances(image_owner="999999999999")),
    ("an image gpuprov did not bake (no lock tag)", _run_instances(image_lock=None)),
])
def test_a_launch_out_of_the_clusters_scope_is_refused(why: str, auths: list[Authorization]) -> None:
    assert _refused(auths), why


@pytest.mark.parametrize(("why", "context"), [
    ("another cluster's node", {"aws:ResourceTag/gpuprov:cluster": "other", "aws:ResourceTag/gpuprov:power": "dynamic"}),
    ("a static node of the cluster", {"aws:ResourceTag/gpuprov:cluster": CLUSTER}),
    ("an instance gpuprov did not tag", {}),
])
def test_terminating_anything_but_the_clusters_dynamic_nodes_is_refused(why: str, context: dict[str, str]) -> None:
    assert _refused([Authorization("ec2:TerminateInstances", arn("instance", "i-0123"), context)]), why


def test_tags_are_set_only_at_launch_and_a_role_without_the_tag_can_do_nothing() -> None:
    later = Authorization("ec2:CreateTags", arn("instance", "i-0123"),
                          {"aws:RequestTag/gpuprov:cluster": CLUSTER, "aws:RequestTag/gpuprov:power": "dynamic"})
    assert _refused([later])
    # A role with no gpuprov:cluster tag: the principal-tag variable resolves to nothing, and no
    # condition on it matches (IAM's rule for a missing key).
    untagged = [Authorization(a.action, a.resource, {"aws:PrincipalAccount": ACCOUNT, **a.context})
                for a in _run_instances()]
    assert [a for a in untagged if "Describe" not in a.action and allowed_by(POLICY, a)
            and a.resource.split(":")[-1].split("/")[0] not in ("subnet", "image")] == []
