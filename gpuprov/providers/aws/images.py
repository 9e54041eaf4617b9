"""Baked images on AWS: a verified node cleaned, stopped and captured as an AMI for its lock.

The AMI and its snapshots are tagged ``gpuprov:lock`` (the lock's hash), ``gpuprov:lock.FIELD``
(driver, source, CUDA, ...), ``gpuprov:baked-at`` and ``gpuprov:baked-from``; `up` finds the
newest one of this account for the cluster's lock with one DescribeImages call.

EC2 captures a disk, not a copy gpuprov could clean first, so the node itself is cleaned
(gpuprov/data/bake-clean.sh, over its pinned SSH, as root): afterwards it holds no host key
and no authorized key, and nobody can log in to it again. It is then stopped (a consistent
file system without a reboot), captured, and terminated: it leaves its cluster, and
`gpuprov up NAME --count N` brings the cluster back to size from the new image. This is what
image builders do with their build instance; `gpuprov image bake --type T` does it on a
throwaway node of its own.
"""

from __future__ import annotations

import re
import subprocess
import time
from typing import Any

from gpuprov import images
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.images import LOCK_FIELDS, BakedImage
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import ClusterFiles, Reporter
from gpuprov.providers.aws import api
from gpuprov.providers.aws.common import backoff, env_seconds, region_of, tags_of
from gpuprov.providers.aws.teardown import terminate_ids
from gpuprov.ssh import node_key, ssh_error_line, ssh_options
from gpuprov.state import NodeRecord

LOCK_TAG = "gpuprov:lock"
# On an image baked from a node of a Slurm cluster (slurmd and munge installed): what an elastic
# cluster's dynamic nodes boot from (docs/slurm.md, "Elastic nodes on AWS").
SLURM_TAG = "gpuprov:slurm"
# EC2 tag values: letters, digits, spaces and + - = . _ : / @ (at most 256).
TAG_VALUE = re.compile(r"[A-Za-z0-9 +\-=._:/@]{0,256}")
REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")


def _tags(cluster: Any, node: NodeRecord, baked_at: str) -> list[dict[str, str]]:
    lock = cluster.lock or LockData()
    tags = {LOCK_TAG: lock["hash"], "gpuprov:baked-at": baked_at,
            "gpuprov:baked-from": f"{cluster.name}/{node.name}", "Name": f"gpuprov {lock['hash']}",
            "gpuprov:os": str(((cluster.spec or {}).get("options") or {}).get("os") or ""),
            **({SLURM_TAG: "yes"} if ((cluster.spec or {}).get("options") or {}).get("scheduler") == "slurm" else {}),
            **{f"gpuprov:lock.{k}": v for k, v in images.lock_record(lock).items()}}
    bad = {k: v for k, v in tags.items() if not TAG_VALUE.fullmatch(v)}
    if bad:
        raise GpuprovError(f"cannot tag the image with {bad}")
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _image(found: dict[str, Any], region: str) -> Any:
    tags = tags_of(found)
    size = sum(int(m.get("Ebs", {}).get("VolumeSize") or 0) for m in found.get("BlockDeviceMappings") or [])
    return BakedImage(id=found["ImageId"], ref=found["ImageId"], provider="aws", lock_hash=tags.get(LOCK_TAG, ""),
                      created=tags.get("gpuprov:baked-at") or str(found.get("CreationDate", "")),
                      source=tags.get("gpuprov:baked-from", ""),
                      lock={k: tags.get(f"gpuprov:lock.{k}", "") for k in LOCK_FIELDS},
                      region=region, size_gib=float(size) if size else None, os=tags.get("gpuprov:os") or None)


def baked(region: str | None, lock_hash: str | None = None) -> list[Any]:
    """This account's AMIs tagged with a lock (only ``lock_hash``'s when given), oldest first:
    one DescribeImages call."""
    aws = api.connect(region)
    tag = ({"Name": f"tag:{LOCK_TAG}", "Values": [lock_hash]} if lock_hash
           else {"Name": "tag-key", "Values": [LOCK_TAG]})
    found = aws.ec2.describe_images(Owners=["self"], Filters=[tag])["Images"]
    out = [_image(i, aws.region) for i in found if i.get("State", "available") == "available"]
    return sorted(out, key=lambda i: (i.created, i.id))


def slurm_image(region: str | None, lock_hash: str) -> str | None:
    """The newest AMI of this account baked for ``lock_hash`` from a node of a Slurm cluster
    (tagged SLURM_TAG), or None: one DescribeImages call."""
    aws = api.connect(region)
    found = aws.ec2.describe_images(Owners=["self"], Filters=[
        {"Name": f"tag:{LOCK_TAG}", "Values": [lock_hash]}, {"Name": f"tag:{SLURM_TAG}", "Values": ["yes"]}])["Images"]
    ours = sorted((_image(i, aws.region) for i in found if i.get("State", "available") == "available"),
                  key=lambda i: (i.created, i.id))
    return ours[-1].ref if ours else None


def locks_of(image_ids: set[str], region: str | None) -> dict[str, str]:
    """{AMI: the lock hash it was baked for} for the AMIs of ``image_ids`` tagged with one (one
    DescribeImages; an AMI deregistered since is left out)."""
    ids = sorted(i for i in image_ids if i.startswith("ami-"))
    if not ids:
        return {}
    aws = api.connect(region)
    try:
        found = aws.ec2.describe_images(ImageIds=ids)["Images"]
    except api.ClientError:  # one AMI gone (InvalidAMIID.NotFound) makes the whole call fail
        return {}
    return {i["ImageId"]: tags_of(i)[LOCK_TAG] for i in found if tags_of(i).get(LOCK_TAG)}


def _clean(node: NodeRecord, files: ClusterFiles, report: Reporter) -> None:
    """Run the fixed clean-up script on the node as root, over its pinned SSH."""
    command = ["ssh", "-p", str(node.ssh_port), *ssh_options(files.known_hosts, node_key(node, files.login_key)),
               "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ControlMaster=no", "-o", "ControlPath=none",
               # Options end here; the remote command is a constant.
               "--", f"{node.user}@{node.address}", "sudo -n /bin/sh -s"]
    script = images.clean_script() + "\nsync\n"
    proc = subprocess.run(command, input=script, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise GpuprovError(f"{node.name}: cleaning the node failed: "
                           f"{ssh_error_line(proc.stderr, proc.returncode) or proc.stdout.strip()[-300:]}")
    for line in proc.stdout.splitlines():
        report(f"{node.name}: {line}")


def _wait(what: str, check: Any) -> None:
    deadline = time.monotonic() + env_seconds("GPUPROV_AWS_IMAGE_TIMEOUT", 3600)
    delay = backoff()
    while not check():
        if time.monotonic() > deadline:
            raise GpuprovError(f"{what}: still not done after {int(env_seconds('GPUPROV_AWS_IMAGE_TIMEOUT', 3600))} s")
        time.sleep(delay)
        delay = min(delay * 2, 30.0)


def _available(ec2: Any, image_id: str) -> bool:
    found = ec2.describe_images(ImageIds=[image_id])["Images"]
    state = found[0]["State"] if found else "missing"
    if state in ("failed", "invalid", "deregistered", "missing"):
        raise GpuprovError(f"image {image_id} is {state}")
    return bool(state == "available")


def bake(cluster: Any, node: NodeRecord, files: ClusterFiles, report: Reporter,
         copy_to: tuple[str, ...] = ()) -> Any:
    """Clean the node, stop it, capture it as an AMI tagged with the lock (image and
    snapshots), wait until it is available, copy it to ``copy_to``, terminate the node."""
    lock = cluster.lock or LockData()
    if not lock.get("hash"):
        raise BadInput(f"cluster '{cluster.name}' has no version lock yet; `gpuprov up` it first")
    region = region_of([node], files)
    aws = api.connect(region)
    for other in copy_to:
        api.check_region(aws.session, other, "--copy-to")
    baked_at = images.now()
    tags = _tags(cluster, node, baked_at)
    name = f"gpuprov-{lock['hash']}-{baked_at.replace('-', '').replace(':', '').lower()}"
    report(f"{node.name}: cleaning the node for capture (host keys, machine id, keys, logs, apt lists)")
    _clean(node, files, report)
    report(f"{node.name}: stopping {node.id} (it cannot be reached again: it will be terminated)")
    api.call(aws.ec2.stop_instances, "StopInstances", InstanceIds=[node.id])
    aws.ec2.get_waiter("instance_stopped").wait(
        InstanceIds=[node.id], WaiterConfig={"Delay": max(1, int(backoff() * 5)), "MaxAttempts": 120})
    # Tagged as it is made (image and snapshots): gpuprov's IAM policy allows tags only so.
    image_id = api.call(
        aws.ec2.create_image, "CreateImage", InstanceId=node.id, Name=name,
        Description=f"gpuprov node for lock {lock['hash']} (driver {lock.get('driver')}, CUDA "
        f"{lock.get('cuda')}) from {cluster.name}/{node.name}",
        TagSpecifications=[{"ResourceType": "image", "Tags": tags},
                           {"ResourceType": "snapshot", "Tags": tags}])["ImageId"]
    report(f"{node.name}: capturing {image_id} ({name}); waiting until it is available")
    try:
        _wait(f"image {image_id}", lambda: _available(aws.ec2, image_id))
    finally:
        gone = terminate_ids(aws, [node.id], report)
        if gone:
            report(f"{node.name}: {node.id} would not terminate; terminate it by hand")
    for other in copy_to:
        target = api.connect(other).ec2
        copied = api.call(
            target.copy_image, f"CopyImage to {other}", SourceImageId=image_id, SourceRegion=aws.region,
            Name=name, Description=f"gpuprov node for lock {lock['hash']} (copy of {aws.region}/{image_id})",
            TagSpecifications=[{"ResourceType": "image", "Tags": tags},
                               {"ResourceType": "snapshot", "Tags": tags}])["ImageId"]
        report(f"copying to {other}: {copied}; waiting until it is available")
        _wait(f"image {copied} in {other}", lambda t=target, c=copied: _available(t, c))
    found = next((i for i in baked(aws.region, lock["hash"]) if i.id == image_id), None)
    if found is None:
        raise GpuprovError(f"captured {image_id} but it is not listed as a baked image")
    report(f"{node.name}: baked {image_id} for lock {lock['hash']}")
    return found


def delete(image: Any, report: Reporter) -> None:
    """Deregister the AMI and delete its snapshots; refused while an instance runs from it."""
    aws = api.connect(image.region)
    users = [i["InstanceId"] for r in aws.ec2.describe_instances(Filters=[
        {"Name": "image-id", "Values": [image.id]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])["Reservations"]
        for i in r["Instances"]]
    if users:
        raise BadInput(f"{image.ref} is in use by {len(users)} instance(s) ({', '.join(users[:5])}); "
                       "`gpuprov down` their clusters first")
    found = aws.ec2.describe_images(ImageIds=[image.id])["Images"]
    snapshots = [m["Ebs"]["SnapshotId"] for f in found for m in f.get("BlockDeviceMappings") or []
                 if m.get("Ebs", {}).get("SnapshotId")]
    api.call(aws.ec2.deregister_image, "DeregisterImage", ImageId=image.id)
    for snapshot in snapshots:
        api.call(aws.ec2.delete_snapshot, f"DeleteSnapshot {snapshot}", SnapshotId=snapshot)
    report(f"deregistered {image.id}" + (f" and deleted {', '.join(snapshots)}" if snapshots else ""))

