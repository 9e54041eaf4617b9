"""EC2 through boto3: all-or-nothing launches, zone failover, nothing orphaned.

The cloud is the source of truth for what exists. Every resource a cluster
owns carries the tag ``gpuprov:cluster=NAME`` (instances, volumes, network
interfaces, elastic IPs, security group, placement group, key pair), so
``up`` completes a cluster by tag, and ``down``/``list`` work when local
state is gone.

One ``up``:
- plan: the type's facts (DescribeInstanceTypes, cached), the zones that
  offer it, members that already exist, the family's vCPU quota (Service
  Quotas; warn and go on when unreadable), the image, the caller's address;
  all read-only, all before anything is created;
- launch: key pair, security group (SSH from one address only, everything
  between members), a cluster placement group for EFA types, then one
  RunInstances with MinCount = MaxCount = the shortfall per zone tried, in
  one zone, failing over on capacity errors and stopping on quota errors;
- anything failing after instances exist (or Ctrl-C) terminates what this
  run launched and waits until it is gone.

Host keys: user-data carries one bootstrap host key per launch, pinned before
the first connection (so SSH checks it strictly from the start); over that
first connection each node makes its own host key and drops the bootstrap one
(``hostkeys.py``), so no key any sshd uses is readable from user-data or IMDS.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gpuprov import catalog, ssh
from gpuprov.catalog import InstanceType
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider, Reporter
from gpuprov.providers.aws import api, hostkeys, userdata
from gpuprov.state import NodeRecord

TAG = "gpuprov:cluster"
BATCH_TAG = "gpuprov:batch"
FIRST_TAG = "gpuprov:first-index"
NODE_USER = "gpuprov"
DEFAULT_DISK_GB = 200
LIVE_STATES = ("pending", "running", "stopping", "stopped")
UBUNTU_SSM = "/aws/service/canonical/ubuntu/server/22.04/stable/current/{arch}/hvm/ebs-gp2/ami-id"
CANONICAL_OWNER = "099720109477"
UBUNTU_NAME = "ubuntu/images/hvm-ssd*/ubuntu-jammy-22.04-{arch}-server-*"
IP_ECHO_URL = "https://checkip.amazonaws.com"
# The largest --count of one `up` (checked in plan, before any AWS call).
# - All or nothing: one RunInstances with MinCount = MaxCount in one zone (and one
#   cluster placement group for EFA types); EC2 rarely has more GPU instances of one
#   type free in one zone at once, so a larger request fails on capacity anyway.
# - 256 x 8 GPUs = 2048 GPUs: beyond that, a scheduler-managed fleet (ParallelCluster,
#   EKS) is the tool, not one SSH-driven `up`.
# - What one `up` does per node from one machine: an SSH session and a host key
#   hand-over per node in parallel, an Ansible bootstrap, an elastic IP each for EFA
#   types (default quota: 5 per region).
# - It stops a typo (`--count 1000000000`) before any work, quota readable or not
#   (the vCPU quota is checked too, but Service Quotas may not answer).
MAX_COUNT = 256
SSH_MIN_PREFIX = {4: 16, 6: 48}  # wider SSH ranges only with allow_wide_ssh_cidr
# Placeholders for DryRun checks of calls that act on resources not made yet.
_DUMMY = {"instance": "i-0000000000000000f", "sg": "sg-0000000000000000f", "eip": "eipalloc-0000000000000000f"}
_DUMMY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvUWBaXnRzrFJ6sIa2Dk2yRo4eMUzFybrsZ8GMKkHs0 dry-run"


def _env_seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def _backoff() -> float:
    """First pause of gpuprov's own polling and retry loops (doubling from there)."""
    return _env_seconds("GPUPROV_AWS_BACKOFF_S", 1.0)


@dataclass
class Prepared:
    """What plan found out, reused by launch in the same process."""

    spec: ClusterSpec
    aws: api.Aws
    itype: InstanceType
    zones: list[str]
    image_id: str
    root_device: str
    ssh_cidr: str
    quota: tuple[str, str, float | None]
    user_data_size: int = 0
    existing: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class LaunchFailed(GpuprovError):
    """A launch that was undone; ``leftover`` lists instances that could not be terminated."""

    def __init__(self, message: str, leftover: list[NodeRecord] | None = None) -> None:
        super().__init__(message)
        self.leftover_nodes = leftover or []


class AwsProvider(Provider):
    name = "aws"
    billable = True

    def __init__(self) -> None:
        self._prepared: Prepared | None = None

    # -- plan ------------------------------------------------------------------------
    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        prep = self.prepare(spec)
        to_create = max(0, spec.count - len(prep.existing))
        price = prep.itype.price_per_hour(prep.aws.region)
        notes = list(prep.notes)
        if price is None:
            notes.append(f"no price estimate for {prep.itype.name} in {prep.aws.region} in gpuprov's table")
        return Plan(
            spec=spec,
            to_create=to_create,
            existing=len(prep.existing),
            billable=True,
            price_per_node_hour=price,
            notes=tuple(notes),
        )

    def prepare(self, spec: ClusterSpec) -> Prepared:
        if self._prepared is not None and self._prepared.spec == spec:
            return self._prepared
        # Everything that can be judged without AWS first: no AWS call for bad input.
        allow_wide = bool(spec.options.get("allow_wide_ssh_cidr"))
        if spec.ssh_cidr:
            check_cidr(spec.ssh_cidr, allow_wide=allow_wide)
        disk = int(spec.options.get("disk_gb") or DEFAULT_DISK_GB)
        if not 8 <= disk <= 16384:
            raise BadInput(f"--disk-gb must be between 8 and 16384, not {disk}")
        if not spec.instance_type:
            raise BadInput("--type is required for the aws provider (`gpuprov types` lists them)")
        if spec.count > MAX_COUNT:
            raise BadInput(
                f"--count {spec.count} is more than gpuprov launches in one cluster ({MAX_COUNT}: "
                "one all-or-nothing RunInstances in one zone); use several clusters"
            )
        user_data_size = userdata.check_size(spec.name, NODE_USER)
        aws = api.connect(spec.region)
        itype = self._facts(aws, spec.instance_type)
        zones = self._zones(aws, itype.name)
        existing = members(aws, spec.name)
        if len(existing) > spec.count:
            raise BadInput(
                f"cluster '{spec.name}' already has {len(existing)} instances, more than --count "
                f"{spec.count}; gpuprov does not shrink clusters (use `gpuprov down` first)"
            )
        notes = [f"region {aws.region}; zones offering {itype.name}: {', '.join(zones)}"]
        zones_in_use = sorted({i["Placement"]["AvailabilityZone"] for i in existing})
        if zones_in_use:
            zones = zones_in_use[:1]
            notes.append(f"{len(existing)} member(s) already run in {zones[0]}: the rest goes there")
        quota = self._quota(aws, itype, spec, notes)
        image_id, root_device = self._image(aws, spec.image, itype.name)
        notes.append(f"image {image_id}; root volume {disk} GiB gp3, encrypted")
        if spec.spot:
            notes.append("spot capacity: cheaper, can be interrupted with a 2-minute notice")
        cidr = check_cidr(spec.ssh_cidr or detect_cidr(), allow_wide=allow_wide)
        notes.append(f"SSH allowed from {cidr} only")
        self._prepared = Prepared(
            spec=spec,
            aws=aws,
            itype=itype,
            zones=zones,
            image_id=image_id,
            root_device=root_device,
            ssh_cidr=cidr,
            quota=quota,
            user_data_size=user_data_size,
            existing=existing,
            notes=notes,
        )
        return self._prepared

    def _facts(self, aws: api.Aws, name: str) -> InstanceType:
        from botocore.exceptions import ClientError

        cached = catalog.cached_types(aws.region, max_age_s=catalog.CACHE_MAX_AGE_S).get(name)
        if cached is not None:
            return cached

        try:
            records = aws.ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
        except ClientError as exc:
            if api.error_code(exc).startswith("InvalidInstanceType"):
                known = [t.name for t in catalog.all_types(aws.region) if t.provider == "aws"]
                raise BadInput(
                    f"EC2 has no instance type '{name}' in {aws.region}{catalog.suggest(name, known)}"
                ) from None
            raise GpuprovError(f"DescribeInstanceTypes failed: {api.error_code(exc)}: {api.error_message(exc)}") from None
        if not records:
            raise BadInput(f"EC2 has no instance type '{name}' in {aws.region}")
        return catalog.record_api_types(aws.region, records)[0]

    def _zones(self, aws: api.Aws, name: str) -> list[str]:
        pages = aws.ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [name]}]
        )
        zones = sorted({o["Location"] for page in pages for o in page["InstanceTypeOfferings"]})
        if not zones:
            raise BadInput(f"{name} is not offered in region {aws.region}; try another --region")
        return zones

    def _quota(
        self, aws: api.Aws, itype: InstanceType, spec: ClusterSpec, notes: list[str]
    ) -> tuple[str, str, float | None]:
        code, quota_name = catalog.quota_for(itype.name, spec.spot)
        need = (itype.vcpus or 0) * spec.count
        try:
            answer = aws.client("service-quotas").get_service_quota(ServiceCode="ec2", QuotaCode=code)
            value = float(answer["Quota"]["Value"])
        except api.Unreachable:
            raise
        except Exception as exc:  # noqa: BLE001  (any failure: warn and go on, as documented)
            reason = api.error_code(exc) or type(exc).__name__
            notes.append(
                f"warning: could not read the vCPU quota '{quota_name}' ({code}): {reason}; going on"
            )
            return code, quota_name, None
        if need > value:
            raise BadInput(
                f"--count {spec.count} x {itype.name} needs {need} vCPUs but the quota "
                f"'{quota_name}' ({code}) in {aws.region} is {value:g}; lower --count or request "
                "an increase in the Service Quotas console"
            )
        notes.append(f"vCPU quota '{quota_name}' ({code}): {value:g}, this cluster needs {need}")
        return code, quota_name, value

    def _image(self, aws: api.Aws, image: str | None, type_name: str) -> tuple[str, str]:
        from botocore.exceptions import ClientError

        if image:
            try:
                found = aws.ec2.describe_images(ImageIds=[image])["Images"]
            except ClientError as exc:
                raise BadInput(f"--image {image}: {api.error_code(exc)}: {api.error_message(exc)}") from None
            if not found:
                raise BadInput(f"--image {image} does not exist in {aws.region}")
            return image, found[0].get("RootDeviceName") or "/dev/sda1"
        archs = self._archs(aws, type_name)
        arch = "arm64" if "arm64" in archs and "x86_64" not in archs else "amd64"
        try:
            value = aws.client("ssm").get_parameter(Name=UBUNTU_SSM.format(arch=arch))["Parameter"]["Value"]
            found = aws.ec2.describe_images(ImageIds=[value])["Images"]
        except api.Unreachable:
            raise
        except Exception:  # noqa: BLE001  (the public parameter may be absent: fall back)
            found = []
        if not found:
            found = aws.ec2.describe_images(
                Owners=[CANONICAL_OWNER],
                Filters=[
                    {"Name": "name", "Values": [UBUNTU_NAME.format(arch=arch)]},
                    {"Name": "state", "Values": ["available"]},
                ],
            )["Images"]
            found = sorted(found, key=lambda i: i.get("CreationDate", ""))[-1:]
        if not found:
            raise BadInput(
                f"no Ubuntu 22.04 image found in {aws.region} (SSM public parameter and Canonical's "
                "images both unavailable); pass --image ami-..."
            )
        return found[0]["ImageId"], found[0].get("RootDeviceName") or "/dev/sda1"

    def _archs(self, aws: api.Aws, type_name: str) -> list[str]:
        entry = catalog._read_cache(aws.region)["types"].get(type_name, {})
        return list((entry.get("record", {}).get("ProcessorInfo") or {}).get("SupportedArchitectures") or [])

    # -- dry run ---------------------------------------------------------------------------
    def dry_run(self, spec: ClusterSpec, report: Reporter) -> None:
        """Ask EC2 (DryRun=True) whether every mutating call up and down make is allowed.

        Tags are given at creation (TagSpecifications), so there is no standalone
        CreateTags to ask about: the policy allows CreateTags only within a create call."""
        prep = self.prepare(spec)
        ec2 = prep.aws.ec2
        subnet = default_subnets(prep.aws).get(prep.zones[0], "")
        tags = lambda kind: tag_specs(spec.name, kind)  # noqa: E731
        checks: list[tuple[str, Any, dict[str, Any]]] = [
            ("ImportKeyPair", ec2.import_key_pair,
             {"KeyName": f"gpuprov-dryrun-{spec.name}", "PublicKeyMaterial": _DUMMY_KEY.encode(),
              "TagSpecifications": tags("key-pair")}),
            ("CreateSecurityGroup", ec2.create_security_group,
             {"GroupName": f"gpuprov-dryrun-{spec.name}", "Description": "gpuprov dry run",
              "TagSpecifications": tags("security-group")}),
            ("AuthorizeSecurityGroupIngress", ec2.authorize_security_group_ingress,
             {"GroupId": _DUMMY["sg"], "IpPermissions": ingress_rules(_DUMMY["sg"], prep.ssh_cidr)}),
            ("RevokeSecurityGroupIngress", ec2.revoke_security_group_ingress,
             {"GroupId": _DUMMY["sg"], "IpPermissions": ingress_rules(_DUMMY["sg"], prep.ssh_cidr)[:1]}),
            ("RunInstances", ec2.run_instances,
             run_params(prep, spec, subnet, _DUMMY["sg"], prep.zones[0], None, "dryrun", b"", 1, 1)),
            ("AllocateAddress", ec2.allocate_address,
             {"Domain": "vpc", "TagSpecifications": tags("elastic-ip")}),
            ("AssociateAddress", ec2.associate_address,
             {"AllocationId": _DUMMY["eip"], "InstanceId": _DUMMY["instance"]}),
            ("TerminateInstances", ec2.terminate_instances, {"InstanceIds": [_DUMMY["instance"]]}),
            ("ReleaseAddress", ec2.release_address, {"AllocationId": _DUMMY["eip"]}),
            ("DeleteSecurityGroup", ec2.delete_security_group, {"GroupId": _DUMMY["sg"]}),
            ("DeleteKeyPair", ec2.delete_key_pair, {"KeyName": f"gpuprov-dryrun-{spec.name}"}),
        ]
        if uses_placement_group(prep.itype, spec.count):
            checks[3:3] = [
                ("CreatePlacementGroup", ec2.create_placement_group,
                 {"GroupName": f"gpuprov-dryrun-{spec.name}", "Strategy": "cluster",
                  "TagSpecifications": tags("placement-group")}),
                ("DeletePlacementGroup", ec2.delete_placement_group,
                 {"GroupName": f"gpuprov-dryrun-{spec.name}"}),
            ]
        refused = []
        for what, fn, kwargs in checks:
            ok, reason = api.dry_run(fn, **kwargs)
            if ok:
                report(f"dry run: ec2:{what} allowed")
            elif ok is None:
                report(f"dry run: ec2:{what} not checked ({reason})")
            else:
                report(f"dry run: ec2:{what} REFUSED ({reason})")
                refused.append(what)
        if refused:
            raise GpuprovError(
                "AWS refuses " + ", ".join(f"ec2:{w}" for w in refused)
                + " for these credentials; see docs/aws-iam-policy.json for what gpuprov needs"
            )

    # -- launch ----------------------------------------------------------------------------
    def launch(self, spec: ClusterSpec, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        prep = self.prepare(spec)
        self._prepared = None  # what exists changes from here on
        aws = prep.aws
        (files.dir / "aws.json").write_text(json.dumps({"region": aws.region}))
        existing = members(aws, spec.name)
        shortfall = spec.count - len(existing)
        if shortfall <= 0:
            report(f"all {len(existing)} instance(s) exist (found by tag {TAG}={spec.name})")
            update_ssh_rule(aws, spec.name, prep.ssh_cidr, report)
            return self._ready_nodes(aws, spec.name, files, report)
        if existing:
            report(f"{len(existing)} instance(s) exist (by tag): launching the {shortfall} missing")
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
            launched = self._run_with_failover(
                prep, spec, subnets, sg, key_name, batch, first, data, shortfall, fresh, report
            )
            started = wait_running(aws, launched, report)
            attach_public_addresses(aws, spec.name, started, report)
            return self._ready_nodes(aws, spec.name, files, report)
        except BaseException as exc:
            self._rollback(aws, spec.name, batch, launched, fresh, report, exc)
            raise

    def _run_with_failover(
        self,
        prep: Prepared,
        spec: ClusterSpec,
        subnets: dict[str, str],
        sg: str,
        key_name: str,
        batch: str,
        first: int,
        data: bytes,
        count: int,
        fresh: bool,
        report: Reporter,
    ) -> list[str]:
        from botocore.exceptions import ClientError

        aws, tried = prep.aws, []
        zones = prep.zones
        reservation = spec.options.get("capacity_reservation")
        if reservation:
            zones = [z for z in zones if z == reservation_zone(aws, reservation)] or zones
        for zone in zones:
            subnet = subnets.get(zone)
            if subnet is None:
                report(f"zone {zone}: skipped (no default subnet)")
                tried.append(f"{zone}: no default subnet")
                continue
            group = None
            if uses_placement_group(prep.itype, spec.count):
                group = ensure_placement_group(aws, spec.name, zone, report)
            report(f"zone {zone}: launching {count} x {prep.itype.name}")
            params = run_params(prep, spec, subnet, sg, zone, group, batch, data, count, first)
            params["KeyName"] = key_name
            params["ClientToken"] = f"{spec.name}-{batch}-{zone}"[:64]
            try:
                answer = aws.ec2.run_instances(**params)
            except ClientError as exc:
                code, message = api.error_code(exc), api.error_message(exc)
                if code in api.CAPACITY_ERRORS:
                    report(f"zone {zone}: {code}: {message}")
                    tried.append(f"{zone}: {code}")
                    if group and fresh:
                        delete_placement_group(aws, group, report)
                    continue
                if code in api.QUOTA_ERRORS:
                    quota_code, quota_name, value = prep.quota
                    shown = f"{value:g} vCPUs" if value is not None else "value unknown (Service Quotas did not answer)"
                    raise GpuprovError(
                        f"AWS refused the launch: {code}: {message} -- quota '{quota_name}' "
                        f"({quota_code}) in {aws.region}: {shown}; request an increase in the "
                        "Service Quotas console"
                    ) from None
                raise GpuprovError(f"RunInstances in {zone} failed: {code}: {message}") from None
            ids = [i["InstanceId"] for i in answer["Instances"]]
            report(f"zone {zone}: launched {', '.join(ids)}")
            return ids
        raise GpuprovError(
            f"no capacity for {count} x {prep.itype.name} in any zone of {aws.region} "
            f"({'; '.join(tried)}); nothing was left running"
        )

    def _rollback(
        self,
        aws: api.Aws,
        name: str,
        batch: str,
        launched: list[str],
        fresh: bool,
        report: Reporter,
        cause: BaseException,
    ) -> None:
        with _no_interrupt():
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

    def _ready_nodes(self, aws: api.Aws, name: str, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        nodes = [node_record(i, name, aws.region) for i in members(aws, name)]
        nodes.sort(key=lambda n: n.extra["index"])
        return nodes

    # -- wait / describe / terminate -------------------------------------------------------------
    def wait_ready(
        self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter
    ) -> list[NodeRecord]:
        """SSH with the pinned bootstrap key, then each node's own host key handed over
        (``hostkeys.hand_over``: idempotent, a node that has its own key is only checked)."""
        pin(nodes, files)
        timeout = _env_seconds("GPUPROV_AWS_SSH_TIMEOUT", 600)
        deadline = time.monotonic() + timeout
        errors: dict[str, str] = {}

        def one(node: NodeRecord) -> None:
            try:
                wait_port(node.address, node.ssh_port, deadline)
                new = hostkeys.hand_over(
                    node, files.key, files.known_hosts, bootstrap_key(node, files),
                    hostkeys.own_key_file(files, node), timeout=max(5.0, deadline - time.monotonic()),
                )
                if new:
                    report(f"{node.name}: SSH ready at {node.address}; host key handed over: the node's own "
                           f"key {ssh.fingerprint(new)} pinned, the bootstrap key removed from its sshd")
                else:
                    report(f"{node.name}: SSH ready at {node.address} (its own host key, pinned)")
            except GpuprovError as exc:
                errors[node.name] = str(exc)

        threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise GpuprovError("; ".join(errors[k] for k in sorted(errors)))
        return nodes

    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        aws = api.connect(region_of(known, files))
        nodes = sorted((node_record(i, name, aws.region) for i in members(aws, name)), key=lambda n: n.extra["index"])
        running = [n for n in nodes if n.address and n.state == "running"]
        if running and files.dir.is_dir():
            pin(running, files, strict=False)
        return nodes

    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        return self.destroy(name, region_of(known, files), report, [n.id for n in known])

    def destroy(self, name: str, region: str | None, report: Reporter, ids: list[str] | None = None) -> int:
        """Terminate every instance tagged with the cluster, wait, then delete its other resources."""
        aws = api.connect(region)
        with _no_interrupt():
            found = {i["InstanceId"] for i in members(aws, name)}
            found |= {i for i in ids or [] if i.startswith("i-")}
            if found:
                report(f"terminating {len(found)} instance(s): {', '.join(sorted(found))}")
                leftover = terminate_ids(aws, sorted(found), report)
                if leftover:
                    raise GpuprovError(
                        f"could not terminate {', '.join(leftover)}; state is kept, run `gpuprov down {name}` again"
                    )
            delete_cluster_resources(aws, name, report)
        return len(found)

    def find_tagged(self, name: str, region: str | None) -> tuple[list[NodeRecord], list[str]]:
        """What carries the cluster's tag in ``region``: live instances, and other resources."""
        aws = api.connect(region)
        nodes = [node_record(i, name, aws.region) for i in members(aws, name)]
        return nodes, tagged_resources(aws, name)

    def tagged_clusters(self, region: str | None) -> dict[str, dict[str, Any]]:
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
            stamp = launched.replace(microsecond=0).isoformat() if hasattr(launched, "isoformat") else str(launched or "")
            entry["created"] = min(entry["created"] or stamp, stamp)
        for group in aws.ec2.describe_security_groups(Filters=[{"Name": "tag-key", "Values": [TAG]}])["SecurityGroups"]:
            name = tags_of(group).get(TAG, "")
            out.setdefault(name, {"nodes": 0, "created": "", "region": aws.region})
        out.pop("", None)
        return out

    def terminate_nodes(self, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
        """Terminate just these nodes (what one ``up`` added); returns the ids that would not go."""
        aws = api.connect(region_of(nodes, files))
        with _no_interrupt():
            return terminate_ids(aws, [n.id for n in nodes], report)

    def expectations(self, node: NodeRecord) -> dict[str, Any]:
        out = super().expectations(node)
        out["spot"] = bool(node.extra.get("spot"))
        return out


# -- helpers: resources -------------------------------------------------------------------------
def check_cidr(cidr: str, *, allow_wide: bool = False) -> str:
    """The normalized range SSH is allowed from; BadInput for what is not one, for the
    whole internet (always), and for ranges wider than an IPv4 /16 or an IPv6 /48
    (unless ``allow_wide``: the --allow-wide-ssh-cidr flag)."""
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise BadInput(f"--ssh-cidr {cidr} is not an address range (example: 203.0.113.7/32)") from None
    if net.prefixlen == 0:
        raise BadInput(f"--ssh-cidr {cidr} would open SSH to the whole internet; give your own address/32")
    widest = SSH_MIN_PREFIX[net.version]
    if net.prefixlen < widest and not allow_wide:
        raise BadInput(
            f"--ssh-cidr {cidr} opens SSH to {net.num_addresses:,} addresses (wider than /{widest}); "
            "give your own address/32, or pass --allow-wide-ssh-cidr if you mean it"
        )
    return str(net)


def detect_cidr() -> str:
    """The caller's public address as a /32 (or /128), from an address echo service."""
    url = os.environ.get("GPUPROV_IP_ECHO_URL", IP_ECHO_URL)
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read(64).decode().strip()
        address = ipaddress.ip_address(text)
    except (OSError, ValueError):
        raise BadInput(
            "could not detect your public address to allow SSH from it; pass --ssh-cidr ADDRESS/32"
        ) from None
    return f"{address}/{address.max_prefixlen}"


def tag_specs(name: str, *kinds: str, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    tags = [{"Key": TAG, "Value": name}, *({"Key": k, "Value": v} for k, v in (extra or {}).items())]
    return [{"ResourceType": kind, "Tags": tags} for kind in kinds]


def members(aws: api.Aws, name: str, batch: str | None = None) -> list[dict[str, Any]]:
    """The cluster's live instances, found by tag."""
    filters = [
        {"Name": f"tag:{TAG}", "Values": [name]},
        {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
    ]
    if batch:
        filters.append({"Name": f"tag:{BATCH_TAG}", "Values": [batch]})
    pages = aws.ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or []}


def index_of(instance: dict[str, Any]) -> int:
    """Node number: the batch's first index plus the launch index (no per-node tagging call)."""
    tags = tags_of(instance)
    try:
        return int(tags.get(FIRST_TAG, "1")) + int(instance.get("AmiLaunchIndex", 0))
    except ValueError:
        return 0


def node_record(instance: dict[str, Any], cluster: str, region: str) -> NodeRecord:
    tags = tags_of(instance)
    index = index_of(instance)
    return NodeRecord(
        name=f"{cluster}-node-{index}",
        id=instance["InstanceId"],
        address=instance.get("PublicIpAddress") or "",
        ssh_port=22,
        user=NODE_USER,
        state=instance["State"]["Name"],
        zone=instance["Placement"]["AvailabilityZone"],
        instance_type=instance["InstanceType"],
        extra={
            "region": region,
            "index": index,
            "batch": tags.get(BATCH_TAG, ""),
            "launch_index": int(instance.get("AmiLaunchIndex", 0)),
            "private_ip": instance.get("PrivateIpAddress", ""),
            "spot": instance.get("InstanceLifecycle") == "spot",
        },
    )


def region_of(known: list[NodeRecord], files: ClusterFiles) -> str | None:
    for node in known:
        if node.extra.get("region"):
            return str(node.extra["region"])
    try:
        return str(json.loads((files.dir / "aws.json").read_text())["region"])
    except (OSError, ValueError, KeyError):
        return None


def bootstrap_key(node: NodeRecord, files: ClusterFiles) -> str:
    path = userdata.first_contact_key(files, node.extra.get("batch", ""), node.extra.get("launch_index", 0))
    if not path.exists():
        raise GpuprovError(
            f"{node.name} ({node.id}): no recorded host key; it was not launched from this "
            "state directory, so gpuprov will not trust it (run `gpuprov down` and `up` again)"
        )
    return path.read_text().strip()


def pin(nodes: list[NodeRecord], files: ClusterFiles, strict: bool = True) -> None:
    """Pin each node's own host key when handed over, else its launch's bootstrap key."""
    keys = {}
    for node in nodes:
        path = hostkeys.own_key_file(files, node)
        if not path.exists():
            path = userdata.first_contact_key(files, node.extra.get("batch", ""), node.extra.get("launch_index", 0))
        if not path.exists():
            if strict:
                raise GpuprovError(
                    f"{node.name} ({node.id}): no recorded host key; it was not launched from this "
                    "state directory, so gpuprov will not trust it (run `gpuprov down` and `up` again)"
                )
            continue
        keys[(node.address, node.ssh_port)] = path.read_text().strip()
    if keys:
        with hostkeys.PIN_LOCK:
            ssh.pin_host_keys(files.known_hosts, keys)


def ensure_key_pair(aws: api.Aws, name: str, files: ClusterFiles, *, replace_ok: bool, report: Reporter) -> str:
    from botocore.exceptions import ClientError

    key_name = f"gpuprov-{name}"
    material = files.key.with_suffix(".pub").read_bytes()
    try:
        aws.ec2.import_key_pair(KeyName=key_name, PublicKeyMaterial=material,
                                TagSpecifications=tag_specs(name, "key-pair"))
        report(f"key pair {key_name} imported (private key stays in {files.key})")
    except ClientError as exc:
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
    from botocore.exceptions import ClientError

    group_name = f"gpuprov-{name}"
    try:
        group_id = aws.ec2.create_security_group(
            GroupName=group_name, VpcId=vpc, Description=f"gpuprov cluster {name}",
            TagSpecifications=tag_specs(name, "security-group"),
        )["GroupId"]
        aws.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=ingress_rules(group_id, cidr))
        report(f"security group {group_id}: SSH from {cidr}, all traffic between members")
        return str(group_id)
    except ClientError as exc:
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
    from botocore.exceptions import ClientError

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
        "members": any(r.get("IpProtocol") == "-1" and group_id in {p.get("GroupId") for p in r.get("UserIdGroupPairs") or []}
                       for r in have),
    }
    for key, rule in (("ssh", ssh_rule), ("members", members_rule)):
        if present[key]:
            continue
        try:
            aws.ec2.authorize_security_group_ingress(GroupId=group_id, IpPermissions=[rule])
        except ClientError as exc:
            if api.error_code(exc) != "InvalidPermission.Duplicate":
                raise
        if key == "ssh":
            report(f"security group {group_id}: SSH from {cidr}")


def uses_placement_group(itype: InstanceType, count: int) -> bool:
    return itype.efa and count > 1


def ensure_placement_group(aws: api.Aws, name: str, zone: str, report: Reporter) -> str:
    from botocore.exceptions import ClientError

    group = f"gpuprov-{name}-{zone}"
    try:
        aws.ec2.create_placement_group(GroupName=group, Strategy="cluster",
                                       TagSpecifications=tag_specs(name, "placement-group"))
        report(f"placement group {group} (cluster strategy)")
    except ClientError as exc:
        if api.error_code(exc) != "InvalidPlacementGroup.Duplicate":
            raise
    return group


def delete_placement_group(aws: api.Aws, group: str, report: Reporter) -> None:
    from botocore.exceptions import ClientError

    try:
        aws.ec2.delete_placement_group(GroupName=group)
        report(f"placement group {group} deleted")
    except ClientError as exc:
        report(f"placement group {group} not deleted: {api.error_code(exc)}")


def reservation_zone(aws: api.Aws, reservation: str) -> str | None:
    try:
        found = aws.ec2.describe_capacity_reservations(CapacityReservationIds=[reservation])
        return str(found["CapacityReservations"][0]["AvailabilityZone"])
    except Exception:  # noqa: BLE001  (unknown here: every zone is tried, EC2 says which fits)
        return None


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


def run_params(
    prep: Prepared,
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
    disk = int(spec.options.get("disk_gb") or DEFAULT_DISK_GB)
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
            *(("spot-instances-request",) if spec.spot else ()),
            extra={BATCH_TAG: batch, FIRST_TAG: str(first), "Name": f"gpuprov-{spec.name}"},
        ),
    }
    if spec.spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    if spec.options.get("capacity_reservation"):
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": spec.options["capacity_reservation"]}
        }
    return params


def wait_running(aws: api.Aws, ids: list[str], report: Reporter) -> list[dict[str, Any]]:
    """Until every instance runs (returned as EC2 describes them); one that stops is a failure."""
    deadline = time.monotonic() + _env_seconds("GPUPROV_AWS_RUNNING_TIMEOUT", 900)
    delay = _backoff()
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
            raise GpuprovError(f"instances not running after {_env_seconds('GPUPROV_AWS_RUNNING_TIMEOUT', 900):.0f}s")
        time.sleep(delay)
        delay = min(delay * 2, 15.0)


def attach_public_addresses(aws: api.Aws, name: str, instances: list[dict[str, Any]], report: Reporter) -> None:
    """An elastic IP (tagged with the cluster) for each instance EC2 gave no public address."""
    for instance in instances:
        if instance.get("PublicIpAddress"):
            continue
        primary = next(
            n["NetworkInterfaceId"] for n in instance["NetworkInterfaces"]
            if n.get("Attachment", {}).get("DeviceIndex") == 0 and n.get("Attachment", {}).get("NetworkCardIndex", 0) == 0
        )
        eip = aws.ec2.allocate_address(Domain="vpc", TagSpecifications=tag_specs(name, "elastic-ip"))
        aws.ec2.associate_address(AllocationId=eip["AllocationId"], NetworkInterfaceId=primary)
        report(f"{instance['InstanceId']}: elastic IP {eip['PublicIp']} (multi-interface launches get none)")


def terminate_ids(aws: api.Aws, ids: list[str], report: Reporter) -> list[str]:
    """Terminate and wait until terminated, retrying; returns the ids that would not go."""
    from botocore.exceptions import BotoCoreError, ClientError

    pending = list(ids)
    deadline = time.monotonic() + _env_seconds("GPUPROV_AWS_TERMINATE_TIMEOUT", 900)
    delay = _backoff()
    for attempt in range(1, 4):
        try:
            aws.ec2.terminate_instances(InstanceIds=pending)
        except (ClientError, BotoCoreError) as exc:
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
    ]


def delete_cluster_resources(aws: api.Aws, name: str, report: Reporter) -> None:
    """Elastic IPs, placement groups, security groups and key pairs tagged with the cluster."""
    from botocore.exceptions import ClientError

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
            except ClientError as exc:
                if api.error_code(exc) != "DependencyViolation" or attempt == 5:
                    report(f"security group {group['GroupId']} not deleted: {api.error_code(exc)}")
                    break
                time.sleep(_backoff() * 2**attempt)
    for key in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]:
        ec2.delete_key_pair(KeyName=key["KeyName"])
        report(f"key pair {key['KeyName']} deleted")


def wait_port(address: str, port: int, deadline: float) -> None:
    """Until ``address:port`` accepts TCP, with exponential backoff (1 s to 20 s)."""
    if not address:
        raise GpuprovError("node has no public address")
    delay = _backoff()
    while True:
        try:
            with socket.create_connection((address, port), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() + delay > deadline:
                raise GpuprovError(f"SSH port {address}:{port} not reachable in time ({exc})") from None
        time.sleep(delay)
        delay = min(delay * 2, 20.0)


@contextmanager
def _no_interrupt() -> Iterator[None]:
    """Cleanup runs to the end: a second Ctrl-C is ignored while it works."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def refresh_catalog(region: str | None) -> tuple[int, str]:
    """Cache the facts of every GPU instance type EC2 offers in ``region``."""
    aws = api.connect(region)
    pages = aws.ec2.get_paginator("describe_instance_types").paginate()
    records = [t for page in pages for t in page["InstanceTypes"] if (t.get("GpuInfo") or {}).get("Gpus")]
    catalog.record_api_types(aws.region, records)
    return len(records), aws.region


PROVIDER = AwsProvider()

__all__ = ["PROVIDER", "TAG", "AwsProvider", "LaunchFailed"]
