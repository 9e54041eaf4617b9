"""What every phase of the AWS provider shares: tags, constants, members found by tag."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from gpuprov import defaults
from gpuprov.clock import utc_text
from gpuprov.errors import GpuprovError, PartialLaunch
from gpuprov.providers import ClusterFiles
from gpuprov.providers.aws import api
from gpuprov.state import NodeRecord

TAG = "gpuprov:cluster"
BATCH_TAG = "gpuprov:batch"
FIRST_TAG = "gpuprov:first-index"
# On the instances of a cluster whose settings name a pull_bucket: where `down` finds the
# cluster's objects when its state is lost (s3_named.py).
PULL_BUCKET_TAG = "gpuprov:pull-bucket"
# A dynamic Slurm node's instance (the controller's power service launched it): of the cluster
# (teardown terminates it), never one of its static nodes (members(static=True) leaves it out).
POWER_TAG = "gpuprov:power"
DYNAMIC = "dynamic"
NODE_USER = "gpuprov"
DEFAULT_DISK_GB = 200
LIVE_STATES = ("pending", "running", "stopping", "stopped")
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
MAX_COUNT = defaults.MAX_NODES  # every provider's --count bound, read as the flag is
SSH_MIN_PREFIX = {4: 16, 6: 48}  # wider SSH ranges only with allow_wide_ssh_cidr


def env_seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def backoff() -> float:
    """First pause of gpuprov's own polling and retry loops (doubling from there)."""
    return env_seconds("GPUPROV_AWS_BACKOFF_S", 1.0)



class LaunchFailed(PartialLaunch):
    """A launch that was undone; ``leftover`` lists instances that could not be terminated."""

    def __init__(self, message: str, leftover: list[NodeRecord] | None = None) -> None:
        super().__init__(message, leftover)


class NoCapacity(GpuprovError):
    """No zone of the region had capacity for the launch (each zone's reason in the message):
    `up --max-price` goes on to the next-cheapest choice."""


@contextmanager
def no_interrupt() -> Iterator[None]:
    """Cleanup runs to the end: a second Ctrl-C is ignored while it works."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def tag_specs(name: str, *kinds: str, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    tags = [{"Key": TAG, "Value": name}, *({"Key": k, "Value": v} for k, v in (extra or {}).items())]
    return [{"ResourceType": kind, "Tags": tags} for kind in kinds]


def members(aws: api.Aws, name: str, batch: str | None = None, static: bool = False) -> list[dict[str, Any]]:
    """The cluster's live instances, found by tag; ``static``: its nodes alone (not the dynamic
    nodes the controller's power service launched)."""
    filters = [
        {"Name": f"tag:{TAG}", "Values": [name]},
        {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
    ]
    if batch:
        filters.append({"Name": f"tag:{BATCH_TAG}", "Values": [batch]})
    pages = aws.ec2.get_paginator("describe_instances").paginate(Filters=filters)
    found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
    return [i for i in found if tags_of(i).get(POWER_TAG) != DYNAMIC] if static else found


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
            "image": instance.get("ImageId", ""),
            # its cluster placement group ("" where none): a switch of topology.conf (gpuprov.slurm.topology)
            "placement_group": (instance.get("Placement") or {}).get("GroupName", ""),
            # EC2's LaunchTime, for `status`'s cost so far (gpuprov.pricing.cost).
            "launched": _iso(instance.get("LaunchTime")),
        },
    )


def region_of(known: list[NodeRecord], files: ClusterFiles) -> str | None:
    for node in known:
        if node.extra.get("region"):
            return str(node.extra["region"])
    region = read_record(files).get("region")
    return str(region) if region else None


def read_record(files: ClusterFiles) -> dict[str, Any]:
    """The cluster's ``aws.json``: its region; the named buckets it pulled through."""
    try:
        found = json.loads((files.dir / "aws.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def update_record(files: ClusterFiles, *, region: str | None = None, pull_bucket: str | None = None,
                  power: bool = False) -> None:
    """``aws.json`` with the region set, or a named bucket added to ``pull_buckets`` (every one
    the cluster ever pulled through: `down` deletes its prefix in each), or ``power``: the
    cluster holds an elastic set-up (power_setup: `down` removes its role and profile)."""
    if not files.dir.is_dir():
        return
    record = read_record(files)
    if region:
        record["region"] = region
    if pull_bucket:
        record["pull_buckets"] = sorted({*record.get("pull_buckets", []), pull_bucket})
    if power:
        record["power"] = True
    tmp = files.dir / "aws.json.tmp"
    tmp.write_text(json.dumps(record, sort_keys=True))
    tmp.replace(files.dir / "aws.json")


def _iso(value: Any) -> str:
    """A time as ISO 8601 (boto3 gives datetimes; state and tests may give text); "" for none."""
    if value is None:
        return ""
    return utc_text(value) if isinstance(value, datetime) else str(value)
