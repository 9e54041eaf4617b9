"""EC2's network topology for Slurm's topology.conf (gpuprov.providers.aws.topology): asked only
for the types EC2 answers it for, in one request per hundred instances, mapped to the nodes'
names; a refusal said in one line, and the nodes then placed by their placement group.

moto has no DescribeInstanceTopology: the shim answers it (a labelled FIXTURE) with the network
nodes the test gives each instance, the published answer's (tests/fixtures/recordings/
ec2-instance-topology-published)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import boto3

from gpuprov.providers.aws.common import node_record
from gpuprov.providers.aws.provider import AwsProvider
from gpuprov.slurm import topology
from tests.aws import iam
from tests.aws.conftest import MOTO_AMI, REGION
from tests.aws.moto_shim import Fault, Shim

REC = Path(__file__).parents[1] / "fixtures" / "recordings" / "ec2-instance-topology-published"
PUBLISHED = json.loads((REC / "describe-instance-topology.json").read_text())["Instances"]


def _launch(itype: str, count: int) -> list[dict]:
    ec2 = boto3.client("ec2", region_name=REGION)
    made = ec2.run_instances(ImageId=MOTO_AMI, InstanceType=itype, MinCount=count, MaxCount=count,
                             TagSpecifications=[{"ResourceType": "instance",
                                                 "Tags": [{"Key": "gpuprov:cluster", "Value": "c"}]}])
    return made["Instances"]


def test_network_nodes_are_asked_once_for_the_types_ec2_answers_and_make_the_switches(shim: Shim) -> None:
    instances = _launch("p4d.24xlarge", 3) + _launch("g5.xlarge", 1)
    nodes = [replace(node_record(i, "c", REGION), name=f"c-node-{k}") for k, i in enumerate(instances, 1)]
    # the published answer's node sets: two instances under one bottom node, one beside them
    for node, published in zip(nodes[:3], (PUBLISHED[0], PUBLISHED[1], PUBLISHED[3]), strict=True):
        shim.topology[node.id] = published["NetworkNodes"]
    shim.calls.clear()
    said: list[str] = []
    found = AwsProvider().network_nodes(nodes, said.append)
    assert found == {n.name: tuple(shim.topology[n.id]) for n in nodes[:3]}, found
    asked = [c for c in shim.calls if c.action == "DescribeInstanceTopology"]
    assert len(asked) == 1 and sorted(v for k, v in asked[0].params.items() if k.startswith("InstanceId.")) == \
        sorted(n.id for n in nodes[:3])  # the g5.xlarge is not asked: EC2 answers none for it
    assert said == []
    policy = json.loads((Path(__file__).parents[2] / "docs" / "aws-iam-policy.json").read_text())
    assert iam.allowed_by(policy, iam.Authorization("ec2:DescribeInstanceTopology", "*", {}))
    places = [topology.Place(n.name, found.get(n.name, ()), zone=n.zone) for n in nodes]
    leaves = [sw for sw in topology.switches("c", places) if sw.nodes]
    assert {sw.name: sw.nodes for sw in leaves} == {
        "nn-3333333333example": ["c-node-1", "c-node-2"], "nn-1235301234example": ["c-node-3"],
        f"zone-{nodes[3].zone}": ["c-node-4"]}


def test_a_refusal_is_one_line_and_no_network_node(shim: Shim) -> None:
    nodes = [node_record(i, "c", REGION) for i in _launch("p5.48xlarge", 2)]
    shim.faults.append(Fault("DescribeInstanceTopology", "UnauthorizedOperation",
                             "You are not authorized to perform this operation.", status=403))
    said: list[str] = []
    assert AwsProvider().network_nodes(nodes, said.append) == {}
    assert len(said) == 1 and "UnauthorizedOperation" in said[0] and "placement group" in said[0], said
    assert AwsProvider().network_nodes([node_record(i, "c", REGION) for i in _launch("g5.xlarge", 1)],
                                       said.append) == {}
    assert len(said) == 1  # nothing asked for a type EC2 answers none for
