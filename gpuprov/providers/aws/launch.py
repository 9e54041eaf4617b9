"""Launch: one RunInstances per zone tried (zone failover on capacity errors), and on any
failure after instances exist (or Ctrl-C) the rollback of what this run launched."""

from __future__ import annotations

import secrets
import time
from typing import Any

from gpuprov import ssh
from gpuprov.catalog import InstanceType
from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles, ClusterSpec, Reporter
from gpuprov.providers.aws import api, options, s3_named, userdata
from gpuprov.providers.aws.common import (
    BATCH_TAG,
    DEFAULT_DISK_GB,
    FIRST_TAG,
    NODE_USER,
    PULL_BUCKET_TAG,
    TAG,
    LaunchFailed,
    NoCapacity,
    backoff,
    env_seconds,
    index_of,
    members,
    no_interrupt,
    node_record,
    tag_specs,
    update_record,
)
from gpuprov.providers.aws.preflight import AwsPlan
from gpuprov.providers.aws.resources import (
    default_subnets,
    default_vpc,
    delete_placement_group,
    ensure_key_pair,
    ensure_placement_group,
    ensure_security_group,
    reservation_zone,
    update_ssh_rule,
    uses_placement_group,
)
from gpuprov.providers.aws.teardown import delete_cluster_resources, terminate_ids
from gpuprov.state import NodeRecord


def launch_cluster(prep: AwsPlan, to_create: int, least: int, files: ClusterFiles,
                   report: Reporter) -> list[NodeRecord]:
    """Create what ``prep`` (this run's plan) lacks: key pair, security group, placement group,
    then ``to_create`` instances in one zone (at least ``least`` where every zone runs short:
    `--min-count`); undone on any failure."""
    spec, aws = prep.spec, prep.aws
    update_record(files, region=aws.region)
    existing = prep.existing
    if to_create <= 0:
        report(f"all {len(existing)} instance(s) exist (found by tag {TAG}={spec.name})")
        update_ssh_rule(aws, spec.name, prep.ssh_cidr, report)
        return _ready_nodes(aws, spec.name, files, report)
    if existing:
        report(f"{len(existing)} instance(s) exist (by tag): launching the {to_create} missing")
    fresh = not existing
    batch = secrets.token_hex(4)
    launched: list[str] = []
    try:
        ssh.ensure_keypair(files.key, f"gpuprov-{spec.name}")
        key_name = ensure_key_pair(aws, spec.name, files, replace_ok=fresh, report=report)
        vpc, subnets = default_vpc(aws), default_subnets(aws)
        sg = ensure_security_group(aws, spec.name, vpc, prep.ssh_cidr, report)
        first = 1 + max((index_of(i) for i in existing), default=0)
        bootstrap = userdata.make_bootstrap_key(files, spec.name, batch)
        data = userdata.encode(
            userdata.render(spec.name, batch, NODE_USER, files.key.with_suffix(".pub").read_text(), bootstrap)
        )
        launched = _run_with_failover(
            prep, subnets, sg, key_name, batch, first, data, (to_create, least), fresh, report
        )
        started = wait_running(aws, launched, report)
        attach_public_addresses(aws, spec.name, started, report)
        return _ready_nodes(aws, spec.name, files, report)
    except BaseException as exc:
        _rollback(aws, spec.name, batch, launched, fresh, report, exc)
        raise


def _no_capacity_in(zone: str, exc: Exception, prep: AwsPlan, new_group: str | None, tried: list[str],
                    report: Reporter) -> None:
    """RunInstances refused in ``zone``: no capacity there is said and recorded in ``tried`` (the
    placement group made for the zone, ``new_group``, removed), and the next zone is tried; a
    quota or any other refusal stops the launch (raised, with the quota's name and value)."""
    aws = prep.aws
    code, message = api.error_code(exc), api.error_message(exc)
    if code in api.CAPACITY_ERRORS:
        report(f"zone {zone}: {code}: {message}")
        tried.append(f"{zone}: {code}")
        if new_group:
            delete_placement_group(aws, new_group, report)
        return
    if code in api.QUOTA_ERRORS:
        quota_code, quota_name, value = prep.quota
        shown = f"{value:g} vCPUs" if value is not None else "value unknown (Service Quotas did not answer)"
        raise GpuprovError(
            f"AWS refused the launch: {code}: {message} -- quota '{quota_name}' "
            f"({quota_code}) in {aws.region}: {shown}; request an increase in the "
            "Service Quotas console"
        ) from None
    raise GpuprovError(f"RunInstances in {zone} failed: {code}: {message}") from None


def _run_with_failover(
    prep: AwsPlan,
    subnets: dict[str, str],
    sg: str,
    key_name: str,
    batch: str,
    first: int,
    data: bytes,
    counts: tuple[int, int],
    fresh: bool,
    report: Reporter,
) -> list[str]:
    spec, aws, tried = prep.spec, prep.aws, []
    count, least = counts  # how many to launch, and the least a short launch may bring
    zones = list(prep.zones)
    reservation = options.of(spec).capacity_reservation
    if reservation:
        zones = [z for z in zones if z == reservation_zone(aws, reservation)] or zones

    def in_zones(minimum: int) -> list[str]:
        """One RunInstances per zone until one launches (MinCount ``minimum``, MaxCount
        ``count``): its instance ids; [] when every zone said it has no capacity."""
        for zone in zones:
            subnet = subnets.get(zone)
            if subnet is None:
                report(f"zone {zone}: skipped (no default subnet)")
                tried.append(f"{zone}: no default subnet")
                continue
            group = None
            if uses_placement_group(prep.itype, spec.launch_count):
                group = ensure_placement_group(aws, spec.name, zone, report)
            report(f"zone {zone}: launching {count} x {prep.itype.name}")
            params = run_params(prep, spec, subnet, sg, zone, group, batch, data, count, first)
            params["MinCount"] = minimum
            params["KeyName"] = key_name
            # (one token per zone and pass: a retried call never launches twice)
            suffix = f"-min{minimum}" if minimum < count else ""
            params["ClientToken"] = f"{spec.name}-{batch}-{zone}{suffix}"[:64]
            try:
                answer = aws.ec2.run_instances(**params)
            except api.ClientError as exc:
                _no_capacity_in(zone, exc, prep, group if fresh else None, tried, report)
                continue
            ids = [i["InstanceId"] for i in answer["Instances"]]
            report(f"zone {zone}: launched {', '.join(ids)}")
            return ids
        return []

    # All of them in one zone first (every zone); then, with --min-count K, at least the
    # nodes that bring the cluster to K (EC2's MinCount: it launches as many as it can up to
    # MaxCount, or none), zone by zone again.
    members = len(prep.existing)
    passes = [count] + ([least] if least < count else [])
    for minimum in passes:
        if minimum < count:
            report(f"no zone has {count} x {prep.itype.name}: --min-count {spec.min_count} accepts "
                   f"{minimum} or more of them")
        ids = in_zones(minimum)
        if ids:
            if len(ids) < count:
                report(f"launched {len(ids)} of {count} (--min-count {spec.min_count}): the cluster has "
                       f"{members + len(ids)} of its {spec.count} node(s); `gpuprov up` again adds the rest")
            return ids
    raise NoCapacity(
        f"no capacity for {passes[-1] if len(passes) > 1 else count} x {prep.itype.name} in any zone "
        f"of {aws.region} ({'; '.join(tried)}); nothing was left running"
    )


def _rollback(
    aws: api.Aws,
    name: str,
    batch: str,
    launched: list[str],
    fresh: bool,
    report: Reporter,
    cause: BaseException,
) -> None:
    with no_interrupt():
        # Instances of this batch that RunInstances made but whose answer never arrived
        # (Ctrl-C mid-call) are found by their batch tag.
        ids = sorted(set(launched) | {i["InstanceId"] for i in members(aws, name, batch=batch)})
        leftover: list[str] = []
        if ids:
            why = "interrupted" if isinstance(cause, KeyboardInterrupt) else "launch failed"
            report(f"{why}: terminating the {len(ids)} instance(s) this run launched: {', '.join(ids)}")
            leftover = terminate_ids(aws, ids, report)
        if fresh and not leftover:
            delete_cluster_resources(aws, name, report)
        if leftover:
            raise LaunchFailed(
                f"{cause}; and {len(leftover)} instance(s) could not be terminated: "
                f"{', '.join(leftover)} (kept in state; run `gpuprov down {name}`)",
                [NodeRecord(name=i, id=i, address="", ssh_port=22, user=NODE_USER, state="unknown",
                            extra={"region": aws.region}) for i in leftover],
            ) from cause


def _ready_nodes(aws: api.Aws, name: str, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
    nodes = [node_record(i, name, aws.region) for i in members(aws, name, static=True)]
    nodes.sort(key=lambda n: n.extra["index"])
    return nodes


def network_interfaces(itype: InstanceType, subnet: str, sg: str) -> list[dict[str, Any]]:
    """One interface per network card: EFA on each when the type has EFA (p4d: 4, p5: 32)."""
    if not itype.efa:
        return [{"DeviceIndex": 0, "SubnetId": subnet, "Groups": [sg],
                 "AssociatePublicIpAddress": True, "DeleteOnTermination": True}]
    cards = max(1, min(itype.network_cards, itype.efa_max_interfaces or 1))
    return [
        {
            "NetworkCardIndex": card,
            "DeviceIndex": 0 if card == 0 else 1,
            "InterfaceType": "efa",
            "SubnetId": subnet,
            "Groups": [sg],
            "DeleteOnTermination": True,
            # EC2 gives no public address to a multi-interface launch; an elastic IP
            # is attached afterwards (attach_public_addresses).
            **({"AssociatePublicIpAddress": True} if cards == 1 else {}),
        }
        for card in range(cards)
    ]


def _pull_bucket_tag(spec: ClusterSpec) -> dict[str, str]:
    """The bucket the cluster's settings name for pull mode (pull_bucket), as a tag: how `down`
    finds the cluster's objects there when its state is lost (s3_named.py)."""
    bucket = s3_named.named(spec.settings)
    return {PULL_BUCKET_TAG: bucket} if bucket else {}


def run_params(
    prep: AwsPlan,
    spec: ClusterSpec,
    subnet: str,
    sg: str,
    zone: str,
    group: str | None,
    batch: str,
    data: bytes,
    count: int,
    first: int,
) -> dict[str, Any]:
    disk = options.of(spec).disk_gb or DEFAULT_DISK_GB
    placement: dict[str, Any] = {"AvailabilityZone": zone}
    if group:
        placement["GroupName"] = group
    params: dict[str, Any] = {
        "ImageId": prep.image_id,
        "InstanceType": prep.itype.name,
        "MinCount": count,
        "MaxCount": count,
        **({"UserData": data} if data else {}),
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2, "HttpEndpoint": "enabled"},
        "BlockDeviceMappings": [
            {"DeviceName": prep.root_device,
             "Ebs": {"VolumeSize": disk, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}
        ],
        "NetworkInterfaces": network_interfaces(prep.itype, subnet, sg),
        "Placement": placement,
        # Everything RunInstances creates carries the cluster tag: the IAM policy requires it
        # (aws:RequestTag) for instances, volumes, interfaces and spot requests.
        "TagSpecifications": tag_specs(
            spec.name, "instance", "volume", "network-interface",
            *(("spot-instances-request",) if options.of(spec).spot else ()),
            extra={BATCH_TAG: batch, FIRST_TAG: str(first), "Name": f"gpuprov-{spec.name}",
                   **_pull_bucket_tag(spec)},
        ),
    }
    if options.of(spec).spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if options.of(spec).capacity_reservation:
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": options.of(spec).capacity_reservation}
        }
    return params


def wait_running(aws: api.Aws, ids: list[str], report: Reporter) -> list[dict[str, Any]]:
    """Until every instance runs (returned as EC2 describes them); one that stops is a failure."""
    deadline = time.monotonic() + env_seconds("GPUPROV_AWS_RUNNING_TIMEOUT", 900)
    delay = backoff()
    while True:
        found = aws.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        states = {i["InstanceId"]: i for r in found for i in r["Instances"]}
        gone = [f"{k} ({v['State']['Name']}: {(v.get('StateReason') or {}).get('Message', 'no reason given')})"
                for k, v in states.items() if v["State"]["Name"] in ("shutting-down", "terminated", "stopped")]
        if gone:
            raise GpuprovError(f"instance(s) stopped while starting: {'; '.join(gone)}")
        if len(states) == len(ids) and all(v["State"]["Name"] == "running" for v in states.values()):
            report(f"{len(ids)} instance(s) running")
            return list(states.values())
        if time.monotonic() > deadline:
            raise GpuprovError(f"instances not running after {env_seconds('GPUPROV_AWS_RUNNING_TIMEOUT', 900):.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 15.0)


def attach_public_addresses(aws: api.Aws, name: str, instances: list[dict[str, Any]], report: Reporter) -> None:
    """An elastic IP (tagged with the cluster) for each instance EC2 gave no public address."""
    for instance in instances:
        if instance.get("PublicIpAddress"):
            continue
        primary = next(
            n["NetworkInterfaceId"] for n in instance["NetworkInterfaces"]
            if n.get("Attachment", {}).get("DeviceIndex") == 0
            and n.get("Attachment", {}).get("NetworkCardIndex", 0) == 0
        )
        eip = aws.ec2.allocate_address(Domain="vpc", TagSpecifications=tag_specs(name, "elastic-ip"))
        aws.ec2.associate_address(AllocationId=eip["AllocationId"], NetworkInterfaceId=primary)
        report(f"{instance['InstanceId']}: elastic IP {eip['PublicIp']} (multi-interface launches get none)")
