"""The EC2 side of an elastic cluster's dynamic nodes (issue 56): what the power service does
when slurmctld resumes or suspends a dynamic node, with the rights of
docs/aws-iam-policy-power.json and nothing more.

- **Resume** one node: one ``RunInstances`` from the cluster's launch template and the image
  baked for its lock, one instance (``MinCount=MaxCount=1``), tagged for the cluster as that
  dynamic node (``gpuprov:cluster``, ``gpuprov:node``, ``gpuprov:power=dynamic`` on the
  instance, its volume and interface), IMDSv2 required, in the cluster's zones in order. A
  zone that says it has no capacity (EC2's insufficient-capacity codes) is skipped for the
  next zone and *rests*: the type is not asked there again for ``REST_S`` seconds (then it is
  tried again). Every zone refused or resting: the node is refused with the EC2 code and where,
  for its Slurm Reason (Slurm then requeues the job onto nodes that come up). Any other refusal
  (a quota, a permission) is not a zone's: it is raised.
- **Suspend**: the running instances of those dynamic nodes of this cluster terminated, found by
  their tags (never a static node's, never another cluster's).
- **Running**: each dynamic node of the cluster that has a live instance, for the service's
  orphan check.

Built and tested against the emulated EC2 (tests/aws/test_power_aws.py), its calls held to the
policy. The launch template, role and profile: power_setup; the node's way into Slurm:
power_boot; the service on the controller that calls this: gpuprov.slurm.power_aws_node. Not
built yet: `up --max-count` on aws making and using them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.providers.aws import api
from gpuprov.providers.aws.common import DYNAMIC, LIVE_STATES, POWER_TAG, TAG

NODE_TAG = "gpuprov:node"
# How long a type rests in a zone that had no capacity for it: ParallelCluster's
# `insufficient_capacity_timeout` default (600 s), after which the zone is tried again.
REST_S = 600.0


@dataclass(frozen=True)
class Plan:
    """What the service knows of the cluster to launch a dynamic node: written at `up`."""

    cluster: str
    launch_template: str  # its id; the template holds the type, group, disk and IMDSv2
    image: str  # the image baked for the cluster's lock
    instance_type: str
    subnets: Mapping[str, str]  # zone -> subnet, in the order zones are tried
    # EFA: one interface per network card (p4d 4, p5 32), each in ``security_group`` (the
    # template then holds no group: EC2 takes groups on the interfaces or the instance, not both);
    # 0: one plain interface in the template's group.
    efa_cards: int = 0
    security_group: str = ""
    # zone -> the cluster placement group its static nodes run in there: a dynamic node launched in
    # that zone joins it (the same spine for NCCL); a zone without one, or a group with no room
    # (EC2's capacity codes: the next zone), launches it outside any group.
    placement_groups: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Started:
    node: str
    instance: str
    zone: str


@dataclass(frozen=True)
class Refused:
    node: str
    code: str  # the EC2 code of the last zone that refused ("" when every zone was resting)
    reason: str  # for the node's Slurm Reason

    def __str__(self) -> str:
        return self.reason


@dataclass
class Rests:
    """Per instance type and zone, until when it rests (epoch seconds), kept in a file of the
    service's (written whole, 0600) so a restart of the service keeps them."""

    path: Path | None = None
    until: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def _key(itype: str, zone: str) -> str:
        return f"{itype}@{zone}"

    @classmethod
    def load(cls, path: Path) -> Rests:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        return cls(path, {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)})

    def resting(self, itype: str, zone: str, now: float) -> float:
        """Seconds left of the rest of ``itype`` in ``zone`` (0: it may be asked)."""
        return max(0.0, self.until.get(self._key(itype, zone), 0.0) - now)

    def rest(self, itype: str, zone: str, now: float) -> None:
        self.until = {k: v for k, v in self.until.items() if v > now}
        self.until[self._key(itype, zone)] = now + REST_S
        if self.path is not None:
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(self.until, handle)
            tmp.replace(self.path)


def _tags(plan: Plan, node: str) -> list[dict[str, Any]]:
    tags = [{"Key": TAG, "Value": plan.cluster}, {"Key": NODE_TAG, "Value": node},
            {"Key": POWER_TAG, "Value": DYNAMIC}, {"Key": "Name", "Value": f"gpuprov-{node}"}]
    return [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume", "network-interface")]


def resume(ec2: Any, plan: Plan, node: str, rests: Rests, now: float, token: str,
           user_data: bytes = b"") -> Started | Refused:
    """One instance for dynamic node ``node`` (module docstring). ``token``: this resume's
    idempotency token (one per node and resume request): a call retried after a lost answer
    launches nothing twice. ``user_data``: the node's own (gpuprov.providers.aws.power_boot), in
    place of the template's none."""
    refused: list[str] = []
    code = ""
    for zone, subnet in plan.subnets.items():
        left = rests.resting(plan.instance_type, zone, now)
        if left:
            refused.append(f"{zone} resting {left:.0f} s")
            continue
        try:
            answer = ec2.run_instances(
                LaunchTemplate={"LaunchTemplateId": plan.launch_template, "Version": "$Default"},
                ImageId=plan.image, InstanceType=plan.instance_type, MinCount=1, MaxCount=1,
                **_network(plan, subnet), Placement={"AvailabilityZone": zone, **(
                    {"GroupName": plan.placement_groups[zone]} if zone in plan.placement_groups else {})},
                MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled", "HttpPutResponseHopLimit": 2},
                TagSpecifications=_tags(plan, node), ClientToken=f"{token}-{zone}"[:64],
                **({"UserData": user_data.decode()} if user_data else {}),
            )
        except api.ClientError as exc:
            if api.error_code(exc) not in api.CAPACITY_ERRORS:
                raise
            code = api.error_code(exc)
            rests.rest(plan.instance_type, zone, now)
            refused.append(f"{zone} {code}")
            continue
        return Started(node, str(answer["Instances"][0]["InstanceId"]), zone)
    where = "; ".join(refused) or "no zone"
    return Refused(node, code, f"no capacity for {plan.instance_type}: {where}")


def _network(plan: Plan, subnet: str) -> dict[str, Any]:
    """The launch's network: the subnet alone (the template's group), or one EFA interface per
    network card in the cluster's group, as static nodes of the type get (launch.network_interfaces)."""
    if not plan.efa_cards:
        return {"SubnetId": subnet}
    return {"NetworkInterfaces": [
        {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
         "SubnetId": subnet, "Groups": [plan.security_group], "DeleteOnTermination": True}
        for card in range(plan.efa_cards)]}


def _dynamic(ec2: Any, cluster: str, nodes: list[str] | None = None) -> list[dict[str, Any]]:
    filters = [{"Name": f"tag:{TAG}", "Values": [cluster]}, {"Name": f"tag:{POWER_TAG}", "Values": [DYNAMIC]},
               {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    if nodes is not None:
        filters.append({"Name": f"tag:{NODE_TAG}", "Values": list(nodes)})
    pages = ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _node_of(instance: dict[str, Any]) -> str:
    return next((t["Value"] for t in instance.get("Tags") or [] if t["Key"] == NODE_TAG), "")


def running(ec2: Any, cluster: str) -> dict[str, list[str]]:
    """Each dynamic node of ``cluster`` with a live instance: its instance ids."""
    out: dict[str, list[str]] = {}
    for instance in _dynamic(ec2, cluster):
        out.setdefault(_node_of(instance), []).append(str(instance["InstanceId"]))
    return out


def suspend(ec2: Any, cluster: str, nodes: list[str]) -> list[str]:
    """The live instances of ``nodes`` (dynamic nodes of ``cluster``) terminated: their ids."""
    if not nodes:
        return []
    ids = sorted(str(i["InstanceId"]) for i in _dynamic(ec2, cluster, nodes) if _node_of(i) in nodes)
    if ids:
        ec2.terminate_instances(InstanceIds=ids)
    return ids


def private_address(ec2: Any, instance: str, deadline_s: float, pause_s: float = 2.0) -> str:
    """The instance's private address once it runs (GpuprovError: it stopped, or not in time)."""
    stop = time.monotonic() + deadline_s
    while True:
        found = ec2.describe_instances(InstanceIds=[instance])["Reservations"]
        held = next((i for r in found for i in r["Instances"]), None)
        state = (held or {}).get("State", {}).get("Name", "unknown")
        if held is not None and state == "running" and held.get("PrivateIpAddress"):
            return str(held["PrivateIpAddress"])
        if state in ("shutting-down", "terminated", "stopping", "stopped"):
            raise GpuprovError(f"{instance} is {state} before it joined")
        if time.monotonic() > stop:
            raise GpuprovError(f"{instance} not running after {deadline_s:.0f} s (it is {state})")
        time.sleep(pause_s)
