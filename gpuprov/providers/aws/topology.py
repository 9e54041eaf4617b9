"""EC2's network topology of a cluster's instances (DescribeInstanceTopology), for the switches
of Slurm's topology.conf (gpuprov.slurm.topology; docs/slurm.md, "Topology").

Asked only for the instance types EC2 answers it for (boto3's reference of the call, 2025: three
network nodes each, four for p6-b200), at most 100 instances a request, and only by a run that
configures Slurm. A refusal (a policy without ec2:DescribeInstanceTopology, a region without it)
is said in one line and costs nothing else: the nodes are then placed by their placement group.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuprov.errors import GpuprovError
from gpuprov.providers.aws import api
from gpuprov.slurm import topology
from gpuprov.state import NodeRecord

TYPES = frozenset({
    "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc7a.12xlarge", "hpc7a.24xlarge", "hpc7a.48xlarge", "hpc7a.96xlarge",
    "hpc7g.4xlarge", "hpc7g.8xlarge", "hpc7g.16xlarge",
    "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "p6-b200.48xlarge",
    "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge",
})
PAGE = 100


def network_nodes(nodes: list[NodeRecord], say: Callable[[str], None]) -> dict[str, tuple[str, ...]]:
    """{node name: its network nodes, top first} for the nodes EC2 knows them of; {} where it
    answers none (said once)."""
    asked = {n.id: n for n in nodes if n.instance_type in TYPES and n.id.startswith("i-")}
    if not asked:
        return {}
    regions = {str(n.extra.get("region") or "") for n in asked.values()}
    out: dict[str, tuple[str, ...]] = {}
    try:
        for region in sorted(regions):
            ec2 = api.connect(region or None).client("ec2")
            ids = [i for i, n in asked.items() if str(n.extra.get("region") or "") == region]
            for start in range(0, len(ids), PAGE):
                answer = api.call(ec2.describe_instance_topology, "DescribeInstanceTopology",
                                  InstanceIds=ids[start:start + PAGE])
                out |= topology.from_instance_topology(answer, {i: asked[i].name for i in ids})
    except GpuprovError as exc:
        say(f"  slurm: no network topology from EC2 ({exc}); topology.conf places the nodes by placement group")
        return {}
    return out
