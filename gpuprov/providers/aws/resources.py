"""Cluster resources: key pair, security group, placement group (all tagged with the cluster)."""

from __future__ import annotations

import ipaddress
from typing import Any

from gpuprov.catalog import InstanceType
from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles, Reporter
from gpuprov.providers.aws import api
from gpuprov.providers.aws.common import TAG, tag_specs


def ensure_key_pair(aws: api.Aws, name: str, files: ClusterFiles, *, replace_ok: bool, report: Reporter) -> str:
    key_name = f"gpuprov-{name}"
    material = files.key.with_suffix(".pub").read_bytes()
    try:
        aws.ec2.import_key_pair(KeyName=key_name, PublicKeyMaterial=material,
                                TagSpecifications=tag_specs(name, "key-pair"))
        report(f"key pair {key_name} imported (private key stays in {files.key})")
    except api.ClientError as exc:
        if api.error_code(exc) != "InvalidKeyPair.Duplicate":
            raise
        if replace_ok:  # no instance uses it: make it match the local key
            aws.ec2.delete_key_pair(KeyName=key_name)
            aws.ec2.import_key_pair(KeyName=key_name, PublicKeyMaterial=material,
                                    TagSpecifications=tag_specs(name, "key-pair"))
            report(f"key pair {key_name} re-imported from {files.key}")
    return key_name


def default_vpc(aws: api.Aws) -> str:
    vpcs = aws.ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise GpuprovError(f"region {aws.region} has no default VPC; create one (`aws ec2 create-default-vpc`)")
    return str(vpcs[0]["VpcId"])


def default_subnets(aws: api.Aws) -> dict[str, str]:
    subnets = aws.ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}


def ingress_rules(group_id: str, cidr: str) -> list[dict[str, Any]]:
    """The group's rules for ``cidr`` (judged by check_cidr in plan, with the options of the run)."""
    net = ipaddress.ip_network(cidr, strict=False)
    ranges: dict[str, Any] = (
        {"IpRanges": [{"CidrIp": str(net), "Description": "gpuprov: SSH from the operator"}]}
        if net.version == 4
        else {"Ipv6Ranges": [{"CidrIpv6": str(net), "Description": "gpuprov: SSH from the operator"}]}
    )
    return [
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, **ranges},
        # Everything between members of the group (EFA needs all traffic to itself).
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id, "Description": "gpuprov: cluster members"}]},
    ]


def ensure_security_group(aws: api.Aws, name: str, vpc: str, cidr: str, report: Reporter) -> str:
    group_name = f"gpuprov-{name}"
    try:
        group_id = aws.ec2.create_security_group(
            GroupName=group_name, VpcId=vpc, Description=f"gpuprov cluster {name}",
            TagSpecifications=tag_specs(name, "security-group"),
        )["GroupId"]
        aws.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=ingress_rules(group_id, cidr))
        report(f"security group {group_id}: SSH from {cidr}, all traffic between members")
        return str(group_id)
    except api.ClientError as exc:
        if api.error_code(exc) != "InvalidGroup.Duplicate":
            raise
    group = aws.ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [group_name]}, {"Name": "vpc-id", "Values": [vpc]}]
    )["SecurityGroups"][0]
    set_ingress(aws, group, cidr, report)
    return str(group["GroupId"])


def update_ssh_rule(aws: api.Aws, name: str, cidr: str, report: Reporter) -> None:
    """On a re-run of `up` for a complete cluster: its security group's SSH range is this run's."""
    tag = [{"Name": f"tag:{TAG}", "Values": [name]}]
    for group in aws.ec2.describe_security_groups(Filters=tag)["SecurityGroups"]:
        set_ingress(aws, group, cidr, report)


def set_ingress(aws: api.Aws, group: dict[str, Any], cidr: str, report: Reporter) -> None:
    """The group's rules become exactly gpuprov's: SSH from ``cidr`` only (any other SSH range
    a previous `up` allowed is revoked, not kept beside it), all traffic between members."""
    group_id = group["GroupId"]
    ssh_rule, members_rule = ingress_rules(group_id, cidr)
    want = {r["CidrIp"] for r in ssh_rule.get("IpRanges", [])} | {r["CidrIpv6"] for r in ssh_rule.get("Ipv6Ranges", [])}
    have = group.get("IpPermissions") or []
    ssh_rules = [r for r in have if r.get("IpProtocol") == "tcp" and r.get("FromPort") == 22 and r.get("ToPort") == 22]
    stale: list[dict[str, Any]] = []
    for rule in ssh_rules:
        old4 = [r for r in rule.get("IpRanges") or [] if r.get("CidrIp") not in want]
        old6 = [r for r in rule.get("Ipv6Ranges") or [] if r.get("CidrIpv6") not in want]
        if old4 or old6:
            stale.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                          **({"IpRanges": [{"CidrIp": r["CidrIp"]} for r in old4]} if old4 else {}),
                          **({"Ipv6Ranges": [{"CidrIpv6": r["CidrIpv6"]} for r in old6]} if old6 else {})})
    if stale:
        aws.ec2.revoke_security_group_ingress(GroupId=group_id, IpPermissions=stale)
        gone = [r.get("CidrIp") or r.get("CidrIpv6") for s in stale for r in [*s.get("IpRanges", []),
                                                                              *s.get("Ipv6Ranges", [])]]
        report(f"security group {group_id}: SSH from {', '.join(gone)} revoked")
    allowed = {x.get("CidrIp") for r in ssh_rules for x in r.get("IpRanges") or []}
    allowed |= {x.get("CidrIpv6") for r in ssh_rules for x in r.get("Ipv6Ranges") or []}
    present = {
        "ssh": want <= allowed,
        "members": any(r.get("IpProtocol") == "-1"
                       and group_id in {p.get("GroupId") for p in r.get("UserIdGroupPairs") or []}
                       for r in have),
    }
    for key, rule in (("ssh", ssh_rule), ("members", members_rule)):
        if present[key]:
            continue
        try:
            aws.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
        except api.ClientError as exc:
            if api.error_code(exc) != "InvalidPermission.Duplicate":
                raise
        if key == "ssh":
            report(f"security group {group_id}: SSH from {cidr}")


def uses_placement_group(itype: InstanceType, count: int) -> bool:
    return itype.efa and count > 1


def ensure_placement_group(aws: api.Aws, name: str, zone: str, report: Reporter) -> str:
    group = f"gpuprov-{name}-{zone}"
    try:
        aws.ec2.create_placement_group(GroupName=group, Strategy="cluster",
                                       TagSpecifications=tag_specs(name, "placement-group"))
        report(f"placement group {group} (cluster strategy)")
    except api.ClientError as exc:
        if api.error_code(exc) != "InvalidPlacementGroup.Duplicate":
            raise
    return group


def delete_placement_group(aws: api.Aws, group: str, report: Reporter) -> None:
    try:
        aws.ec2.delete_placement_group(GroupName=group)
        report(f"placement group {group} deleted")
    except api.ClientError as exc:
        report(f"placement group {group} not deleted: {api.error_code(exc)}")


def reservation_zone(aws: api.Aws, reservation: str) -> str | None:
    try:
        found = aws.ec2.describe_capacity_reservations(CapacityReservationIds=[reservation])
        return str(found["CapacityReservations"][0]["AvailabilityZone"])
    except Exception:  # noqa: BLE001  (unknown here: every zone is tried, EC2 says which fits)
        return None
