"""The bootstrap host key in user-data, pinned before first contact; SSH failure rolls back;
the IAM policy in the repo covers every call gpuprov makes, with its conditions."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import yaml

from gpuprov.state import Store
from tests.aws import iam
from tests.aws.conftest import ROOT_POLICY, instances
from tests.aws.helpers import CIDR, assert_nothing_left, invoke, up
from tests.aws.moto_shim import Shim


def _user_data(shim: Shim) -> dict:
    (run,) = shim.run_calls()
    return yaml.safe_load(base64.b64decode(run.params["UserData"]))


def test_bootstrap_key_in_user_data_is_pinned_before_first_contact(capsys, shim: Shim, ami: str,
                                                                   gpuprov_home: Path, tmp_path: Path) -> None:
    code, _, err = invoke(capsys, "up", "--name", "trust", "--type", "p4d.24xlarge", "--count", "2",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes", "--no-rollback", "-o", "json")
    # moto's addresses answer no SSH: the wait fails, and --no-rollback keeps the nodes to look at
    assert code == 1, err
    cluster = Store().get_cluster("trust")
    assert cluster is not None and cluster.failed_step == "reach" and len(cluster.nodes) == 2
    known = (gpuprov_home / "clusters" / "trust" / "known_hosts").read_text().splitlines()
    pinned = {line.split()[0]: " ".join(line.split()[1:3]) for line in known}
    doc = _user_data(shim)
    assert doc["ssh_deletekeys"] is False and doc["ssh_genkeytypes"] == ["ed25519"]
    script = doc["bootcmd"][0][2]
    begin, end = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"
    assert script.count(begin) == 1 and script.count(end) == 1
    private = tmp_path / "bootstrap"
    private.write_text(script[script.index(begin):script.index(end) + len(end)] + "\n")
    private.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True,
                             check=True).stdout.split()[:2]
    # Until each node has handed over to its own key, every node is pinned to the bootstrap key.
    for node in cluster.nodes:
        assert pinned[node.address] == " ".join(derived), node.name
    pub = (gpuprov_home / "clusters" / "trust" / "id_ed25519.pub").read_text().strip()
    assert doc["users"][1]["ssh_authorized_keys"] == [pub]
    code, _, err = invoke(capsys, "down", "trust", "--yes")
    assert code == 0, err
    assert_nothing_left("trust")


def test_nodes_that_never_answer_ssh_are_rolled_back(capsys, shim: Shim, ami: str) -> None:
    code, _, err = invoke(capsys, "up", "--name", "silent", "--type", "p4d.24xlarge", "--count", "2",
                          "--image", ami, "--ssh-cidr", CIDR, "--yes")
    assert code == 1
    assert "nodes not reachable: removing what this run launched" in err
    assert_nothing_left("silent")
    assert len(instances("silent", ("terminated",))) == 2
    assert Store().get_cluster("silent") is None


DESTRUCTIVE = {
    "ec2:TerminateInstances", "ec2:DeleteSecurityGroup", "ec2:RevokeSecurityGroupIngress",
    "ec2:AuthorizeSecurityGroupIngress", "ec2:ReleaseAddress", "ec2:DeleteKeyPair", "ec2:DeletePlacementGroup",
    "ec2:DisassociateAddress", "ec2:AssociateAddress",
}
CREATING = {"ec2:RunInstances", "ec2:ImportKeyPair", "ec2:CreateSecurityGroup", "ec2:CreatePlacementGroup",
            "ec2:AllocateAddress"}


def _every_call(capsys, ami: str) -> None:
    """up (spot, EFA: placement group, elastic IPs), a re-run with another SSH range, a dry run, down."""
    assert up(capsys, ami, "iam", "--spot", count=2)[0] == 0
    rerun = [a if a != CIDR else "198.51.100.0/24" for a in ("--ssh-cidr", CIDR)]
    code, _, err = invoke(capsys, "up", "--name", "iam", "--type", "p4d.24xlarge", "--count", "2", "--image", ami,
                          *rerun, "--spot", "--no-bootstrap", "--yes")
    assert code == 0, err
    assert invoke(capsys, "up", "--name", "iam2", "--type", "p4d.24xlarge", "--count", "2", "--image", ami,
                  "--ssh-cidr", CIDR, "--dry-run")[0] == 0
    assert invoke(capsys, "down", "iam", "--yes")[0] == 0


def test_iam_policy_allows_every_call_gpuprov_makes(capsys, shim: Shim, ami: str) -> None:
    _every_call(capsys, ami)
    policy = json.loads(ROOT_POLICY.read_text())
    allowed = set()
    for statement in policy["Statement"]:
        actions = statement["Action"]
        allowed.update([actions] if isinstance(actions, str) else actions)
    prefix = {"ec2": "ec2", "servicequotas": "servicequotas", "ssm": "ssm"}
    used = {f"{prefix[c.service]}:{c.action}" for c in shim.calls if c.service in prefix}
    assert used - allowed == set()
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreatePlacementGroup",
            "ec2:RevokeSecurityGroupIngress"} <= used


def test_every_mutating_call_is_allowed_only_with_its_conditions(capsys, shim: Shim, ami: str) -> None:
    """Finding 15: each mutating EC2 call gpuprov made (DryRun ones too) is allowed by a statement
    whose conditions it meets, and by none without them: the cluster tag on create
    (aws:RequestTag, CreateTags only within a create call), IMDSv2 and encrypted volumes on
    RunInstances, the cluster tag on the resource for every destructive call."""
    _every_call(capsys, ami)
    policy = json.loads(ROOT_POLICY.read_text())
    calls = iam.mutating(shim.calls)
    assert not [c for c in calls if c.action == "CreateTags"]  # tags go with the create call, dry run too
    actions = {f"ec2:{c.action}" for c in calls}
    assert CREATING | DESTRUCTIVE <= actions | {"ec2:DisassociateAddress"}, actions
    checked = 0
    for call in calls:
        for auth in iam.authorizations(call, "iam" if not call.dry_run else "iam2"):
            assert iam.allowed_by(policy, auth), f"refused: {auth} ({'DryRun ' if call.dry_run else ''}{call.action})"
            checked += 1
            # ... and refused without each condition that makes it safe
            if iam.RESOURCE_TAG in auth.context:
                bare = iam.Authorization(auth.action, auth.resource,
                                         {k: v for k, v in auth.context.items() if k != iam.RESOURCE_TAG})
                assert not iam.allowed_by(policy, bare), f"allowed on an untagged resource: {bare}"
            if iam.REQUEST_TAG in auth.context:
                bare = iam.Authorization(auth.action, auth.resource,
                                         {k: v for k, v in auth.context.items() if k != iam.REQUEST_TAG})
                assert not iam.allowed_by(policy, bare), f"allowed to create untagged: {bare}"
            for key, bad in (("ec2:MetadataHttpTokens", "optional"), ("ec2:Encrypted", "false")):
                if key in auth.context:
                    worse = iam.Authorization(auth.action, auth.resource, {**auth.context, key: bad})
                    assert not iam.allowed_by(policy, worse), f"allowed with {key}={bad}: {worse}"
            if auth.action == "ec2:CreateTags":
                standalone = iam.Authorization(auth.action, auth.resource,
                                               {k: v for k, v in auth.context.items() if k != "ec2:CreateAction"})
                assert not iam.allowed_by(policy, standalone), f"standalone CreateTags allowed: {standalone}"
    assert checked > 40
    # the conditions gpuprov's RunInstances really carries
    run = shim.run_calls()[0]
    contexts = {a.resource.split(":")[-1].split("/")[0]: a.context for a in iam.authorizations(run, "iam")
                if a.action == "ec2:RunInstances"}
    assert contexts["instance"]["ec2:MetadataHttpTokens"] == "required"
    assert contexts["volume"]["ec2:Encrypted"] == "true"
    assert {contexts[k][iam.REQUEST_TAG] for k in ("instance", "volume", "network-interface",
                                                  "spot-instances-request")} == {"iam"}


def test_destructive_statements_all_require_the_cluster_tag() -> None:
    """No statement allows a destructive call without aws:ResourceTag/gpuprov:cluster."""
    policy = json.loads(ROOT_POLICY.read_text())
    for statement in policy["Statement"]:
        actions = statement["Action"]
        for action in [actions] if isinstance(actions, str) else actions:
            if action in DESTRUCTIVE:
                assert statement.get("Condition", {}).get("Null", {}).get(iam.RESOURCE_TAG) == "false", statement
            if action == "ec2:CreateTags":
                assert statement["Condition"]["StringEquals"]["ec2:CreateAction"], statement
