"""Host keys handed over in user-data and pinned before first contact; SSH failure rolls back;
the IAM policy in the repo covers every call gpuprov makes."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import yaml

from gpuprov.state import Store
from tests.aws.conftest import ROOT_POLICY, instances
from tests.aws.moto_shim import Shim
from tests.aws.test_up import CIDR, assert_nothing_left, invoke, up


def _user_data(shim: Shim) -> dict:
    (run,) = shim.run_calls()
    return yaml.safe_load(base64.b64decode(run.params["UserData"]))


def test_host_keys_in_user_data_match_the_pinned_keys(capsys, shim: Shim, ami: str, gpuprov_home: Path,
                                                      tmp_path: Path) -> None:
    code, _, err = invoke(capsys, "up", "--name", "trust", "--type", "p4d.24xlarge", "--count", "2",
                            "--image", ami, "--ssh-cidr", CIDR, "--yes", "--no-rollback", "-o", "json")
    # moto's addresses answer no SSH: the wait fails, and --no-rollback keeps the nodes to look at
    assert code == 1, err
    cluster = Store().get_cluster("trust")
    assert cluster is not None and cluster.state == "failed" and len(cluster.nodes) == 2
    known = (gpuprov_home / "clusters" / "trust" / "known_hosts").read_text().splitlines()
    pinned = {line.split()[0]: " ".join(line.split()[1:3]) for line in known}
    doc = _user_data(shim)
    assert doc["ssh_deletekeys"] is False and doc["ssh_genkeytypes"] == []
    script = doc["bootcmd"][0][2]
    assert "ami-launch-index" in script and "X-aws-ec2-metadata-token" in script
    bodies = {int(line.split(")")[0].strip()): line.split("key='")[1].split("'")[0]
              for line in script.splitlines() if "key='" in line}
    assert sorted(bodies) == [0, 1]
    for node in cluster.nodes:
        private = tmp_path / f"key-{node.extra['launch_index']}"
        private.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n" + bodies[node.extra["launch_index"]]
                           + "\n-----END OPENSSH PRIVATE KEY-----\n")
        private.chmod(0o600)
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True,
                                 check=True).stdout.split()[:2]
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


def test_iam_policy_allows_every_call_gpuprov_makes(capsys, shim: Shim, ami: str) -> None:
    assert up(capsys, ami, "iam", "--spot", count=2)[0] == 0
    assert invoke(capsys, "up", "--name", "iam2", "--type", "p4d.24xlarge", "--count", "2", "--image", ami,
                  "--ssh-cidr", CIDR, "--dry-run")[0] == 0
    assert invoke(capsys, "down", "iam", "--yes")[0] == 0
    policy = json.loads(ROOT_POLICY.read_text())
    allowed = set()
    for statement in policy["Statement"]:
        actions = statement["Action"]
        allowed.update([actions] if isinstance(actions, str) else actions)
    prefix = {"ec2": "ec2", "servicequotas": "servicequotas", "ssm": "ssm"}
    used = {f"{prefix[c.service]}:{c.action}" for c in shim.calls if c.service in prefix}
    assert used - allowed == set()
    assert {"ec2:RunInstances", "ec2:TerminateInstances", "ec2:CreatePlacementGroup"} <= used
