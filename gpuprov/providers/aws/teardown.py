"""Teardown, and what is found by tag when local state is gone."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles, Orphans, Reporter
from gpuprov.providers.aws import api, power_setup, s3, s3_named
from gpuprov.providers.aws.common import (
    LIVE_STATES,
    PULL_BUCKET_TAG,
    TAG,
    backoff,
    env_seconds,
    members,
    no_interrupt,
    node_record,
    region_of,
    tags_of,
)
from gpuprov.providers.aws.resources import delete_placement_group
from gpuprov.state import NodeRecord


def destroy(name: str, region: str | None, report: Reporter, ids: list[str] | None = None,
            buckets: list[str] | tuple[str, ...] = (), power: bool = False) -> int:
    """Terminate every instance tagged with the cluster, wait, then delete its other resources;
    in each named pull bucket (``buckets``, and those its instances' tags name), the cluster's
    objects alone. An elastic cluster's launch templates go first (its power service launches
    from them alone: no dynamic node starts while the cluster goes), its dynamic nodes with the
    rest, its controller's role and profile last (``power``: the record says it has them; a
    template found says so too)."""
    aws = api.connect(region)
    with no_interrupt():
        power = power_setup.remove_templates(aws, name, report) or power
        live = members(aws, name)
        found = {i["InstanceId"] for i in live}
        named = {*buckets, *(tags_of(i)[PULL_BUCKET_TAG] for i in live if tags_of(i).get(PULL_BUCKET_TAG))}
        found |= {i for i in ids or [] if i.startswith("i-")}
        if found:
            report(f"terminating {len(found)} instance(s): {', '.join(sorted(found))}")
            leftover = terminate_ids(aws, sorted(found), report)
            if leftover:
                raise GpuprovError(
                    f"could not terminate {', '.join(leftover)}; state is kept, run `gpuprov down {name}` again"
                )
        delete_cluster_resources(aws, name, report)
        s3_named.delete_prefixes(aws, name, named, report)
        if power:
            power_setup.remove_access(aws, name, report)
    return len(found)


def find_tagged(name: str, region: str | None) -> tuple[list[NodeRecord], list[str]]:
    """What carries the cluster's tag in ``region``: live instances, and other resources."""
    aws = api.connect(region)
    nodes = [node_record(i, name, aws.region) for i in members(aws, name)]
    return nodes, tagged_resources(aws, name)


def tagged_clusters(region: str | None) -> dict[str, dict[str, Any]]:
    """Every cluster name found by tag in ``region``: {name: {"nodes", "created", "region"}}."""
    aws = api.connect(region, attempts=2)
    pages = aws.ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "tag-key", "Values": [TAG]},
                 {"Name": "instance-state-name", "Values": list(LIVE_STATES)}]
    )
    out: dict[str, dict[str, Any]] = {}
    for instance in (i for page in pages for r in page["Reservations"] for i in r["Instances"]):
        name = tags_of(instance).get(TAG, "")
        entry = out.setdefault(name, {"nodes": 0, "created": "", "region": aws.region})
        entry["nodes"] += 1
        launched = instance.get("LaunchTime")
        stamp = utc_text(launched) if isinstance(launched, datetime) else str(launched or "")
        entry["created"] = min(entry["created"] or stamp, stamp)
    for group in aws.ec2.describe_security_groups(Filters=[{"Name": "tag-key", "Values": [TAG]}])["SecurityGroups"]:
        name = tags_of(group).get(TAG, "")
        out.setdefault(name, {"nodes": 0, "created": "", "region": aws.region})
    out.pop("", None)
    return out


def find_orphans(name: str, region: str | None) -> Orphans | None:
    """What AWS tags with ``name`` when AWS is set up here (or ``region`` is given); None otherwise."""
    if not (region or api.configured()):
        return None
    try:
        nodes, other = find_tagged(name, region)
    except api.ConfigError:
        raise  # a broken profile or config file is said, never taken for "nothing tagged"
    except BadInput:
        return None
    if not nodes and not other:
        return None
    where = nodes[0].extra["region"] if nodes else region or api.connect(region).region
    what = ", ".join([f"{len(nodes)} instance(s)", *other])
    return Orphans(provider="aws", nodes=tuple(nodes), found=f"AWS ({where}) has {what} tagged with it",
                   removed="unrecorded aws instance(s) removed, found by tag", region=where)


def list_tagged_clusters(regions: set[str | None], asked: bool) -> dict[str, dict[str, Any]] | None:
    """Clusters found by tag in each of ``regions``; None when AWS is not set up here and not asked."""
    if not (asked or api.configured()):
        return None
    out: dict[str, dict[str, Any]] = {}
    for region in sorted(regions, key=str):
        out.update(tagged_clusters(region))
    return out


def terminate_nodes(nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
    """Terminate just these nodes (what one ``up`` added); returns the ids that would not go."""
    aws = api.connect(region_of(nodes, files))
    with no_interrupt():
        return terminate_ids(aws, [n.id for n in nodes], report)


def terminate_ids(aws: api.Aws, ids: list[str], report: Reporter) -> list[str]:
    """Terminate and wait until terminated, retrying; returns the ids that would not go."""
    pending = list(ids)
    deadline = time.monotonic() + env_seconds("GPUPROV_AWS_TERMINATE_TIMEOUT", 900)
    delay = backoff()
    for attempt in range(1, 4):
        try:
            aws.ec2.terminate_instances(InstanceIds=pending)
        except (api.ClientError, api.BotoCoreError) as exc:
            code = api.error_code(exc)
            if code == "InvalidInstanceID.NotFound" and len(pending) == 1:
                return []
            report(f"terminate attempt {attempt} failed: {code or exc}")
            time.sleep(delay)
            delay *= 2
            continue
        while pending and time.monotonic() < deadline:
            found = aws.ec2.describe_instances(InstanceIds=pending)["Reservations"]
            pending = [i["InstanceId"] for r in found for i in r["Instances"] if i["State"]["Name"] != "terminated"]
            if pending:
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
        if not pending:
            report(f"{len(ids)} instance(s) terminated")
            return []
    return pending


def tagged_resources(aws: api.Aws, name: str) -> list[str]:
    tag = [{"Name": f"tag:{TAG}", "Values": [name]}]
    ec2 = aws.ec2
    return [
        *(f"elastic IP {a['PublicIp']}" for a in ec2.describe_addresses(Filters=tag)["Addresses"]),
        *(f"placement group {g['GroupName']}" for g in ec2.describe_placement_groups(Filters=tag)["PlacementGroups"]),
        *(f"security group {g['GroupId']}" for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]),
        *(f"key pair {k['KeyName']}" for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]),
        *(f"S3 bucket {b}" for b in s3.tagged_buckets(aws, name)),
    ]


def delete_cluster_resources(aws: api.Aws, name: str, report: Reporter) -> None:
    """Elastic IPs, placement groups, security groups, key pairs and S3 buckets tagged with the cluster."""
    ec2 = aws.ec2
    tag = [{"Name": f"tag:{TAG}", "Values": [name]}]
    for address in ec2.describe_addresses(Filters=tag)["Addresses"]:
        if address.get("AssociationId"):
            ec2.disassociate_address(AssociationId=address["AssociationId"])
        ec2.release_address(AllocationId=address["AllocationId"])
        report(f"elastic IP {address['PublicIp']} released")
    for group in ec2.describe_placement_groups(Filters=tag)["PlacementGroups"]:
        delete_placement_group(aws, group["GroupName"], report)
    for group in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]:
        for attempt in range(6):  # interfaces of just-terminated instances detach a little later
            try:
                ec2.delete_security_group(GroupId=group["GroupId"])
                report(f"security group {group['GroupId']} deleted")
                break
            except api.ClientError as exc:
                if api.error_code(exc) != "DependencyViolation" or attempt == 5:
                    report(f"security group {group['GroupId']} not deleted: {api.error_code(exc)}")
                    break
                time.sleep(backoff() * 2**attempt)
    for key in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]:
        ec2.delete_key_pair(KeyName=key["KeyName"])
        report(f"key pair {key['KeyName']} deleted")
    s3.delete_buckets(aws, name, report)  # pull mode's channel (s3.py)
