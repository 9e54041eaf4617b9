"""Baked images of local nodes: a node committed, cleaned in a stopped copy, committed again.

The image is REPO:LOCKHASH-TIME (gpuprov.providers.docker.engine.BAKED_REPO, or GPUPROV_BAKED_REPO),
labelled with the lock's hash (IMAGE_LABEL) and fields, where it was baked from and when.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from typing import Any

from gpuprov import images
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.images import LOCK_FIELDS, BakedImage
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import Reporter
from gpuprov.providers.docker.engine import BAKED_REPO, IMAGE_LABEL, LABEL, NODE_LABEL, docker
from gpuprov.state import NodeRecord

# A label value is written into a Dockerfile instruction (docker commit --change): only these.
LABEL_VALUE = re.compile(r"[A-Za-z0-9._:/+~@-]*")


def repository() -> str:
    """Where baked images go: BAKED_REPO, or GPUPROV_BAKED_REPO (a docker repository name)."""
    repo = os.environ.get("GPUPROV_BAKED_REPO", BAKED_REPO)
    if not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*", repo):
        raise BadInput(f"GPUPROV_BAKED_REPO={repo!r} is not a docker repository name")
    return repo


def baked(repo: str) -> list[Any]:
    ids = docker("image", "ls", repo, "-q", "--no-trunc", "--filter",
                 f"label={IMAGE_LABEL}").stdout.decode().split()
    if not ids:
        return []
    out = []
    for info in json.loads(docker("image", "inspect", *dict.fromkeys(ids)).stdout):
        labels = info["Config"].get("Labels") or {}
        tags = [t for t in info.get("RepoTags") or [] if t.startswith(f"{repo}:")]
        if not labels.get(IMAGE_LABEL) or not tags:
            continue
        out.append(BakedImage(
            id=info["Id"], ref=sorted(tags)[-1], provider="docker",
            lock_hash=labels[IMAGE_LABEL], created=labels.get("gpuprov.baked-at", ""),
            source=labels.get("gpuprov.baked-from", ""),
            lock={k: labels.get(f"gpuprov.lock.{k}", "") for k in LOCK_FIELDS},
            size_gib=round(info.get("Size", 0) / 2**30, 2)))
    return sorted(out, key=lambda i: (i.created, i.id))


def bake(cluster: Any, node: NodeRecord, repo: str, report: Reporter) -> Any:
    """Pause the node, commit it, copy its Docker volume (the images the node pulled) into
    a stopped copy, clean that copy (gpuprov/data/bake-clean.sh) and commit it as
    BAKED_REPO:LOCKHASH-TIME; the node runs on, untouched. Nothing is left behind but the
    image, whatever fails."""
    lock = cluster.lock or LockData()
    if not lock.get("hash"):
        raise BadInput(f"cluster '{cluster.name}' has no version lock yet; `gpuprov up` it first")
    cname = node.extra.get("container") or ""
    baked_at = images.now()
    labels = {IMAGE_LABEL: lock["hash"], "gpuprov.baked-at": baked_at,
              "gpuprov.baked-from": f"{cluster.name}/{node.name}",
              **{f"gpuprov.lock.{k}": v for k, v in images.lock_record(lock).items()},
              # A new node's own labels name its cluster; the image names none.
              LABEL: "", NODE_LABEL: ""}
    bad = {k: v for k, v in labels.items() if not LABEL_VALUE.fullmatch(v)}
    if bad:
        raise GpuprovError(f"cannot label the image with {bad}")
    tag = f"{repo}:{lock['hash']}-{baked_at.replace('-', '').replace(':', '').lower()}"
    token = secrets.token_hex(4)
    scratch, helper = f"gpuprov/bake-scratch:{token}", f"gpuprov-bake-{token}"
    copy = ("set -eu\necho 'clean: keep the Docker images the node pulled'\n"
            "cp -a /mnt/gpuprov-docker/. /var/lib/docker/\n")
    try:
        report(f"{node.name}: pausing {cname} and capturing its file system")
        docker("pause", cname)
        try:
            docker("commit", "--pause=false", cname, scratch, timeout=3600)
            report(f"{node.name}: cleaning a stopped copy (host keys, machine id, keys, logs, apt lists)")
            docker("create", "--name", helper, "--network", "none", "--label", f"{LABEL}=",
                   "--label", f"{NODE_LABEL}=",
                   "-v", f"{cname}-docker:/mnt/gpuprov-docker:ro", scratch,
                   "/bin/sh", "-c", copy + images.clean_script())
            cleaned = docker("start", "-a", helper, check=False, timeout=3600)
        finally:
            docker("unpause", cname, check=False)
        if cleaned.returncode != 0:
            raise GpuprovError(f"{node.name}: cleaning the copy failed: "
                               f"{(cleaned.stdout + cleaned.stderr).decode().strip()[-500:]}")
        for line in cleaned.stdout.decode().splitlines():
            report(f"{node.name}: {line}")
        # The node image has no entrypoint; the helper's command (the clean-up) is replaced.
        changes = ['CMD ["/sbin/init"]', *(f'LABEL {k}="{v}"' for k, v in labels.items())]
        docker("commit", *(a for c in changes for a in ("--change", c)), helper, tag, timeout=3600)
    finally:
        docker("rm", "-f", "-v", helper, check=False)
        docker("image", "rm", scratch, check=False)
    found = next((i for i in baked(repo) if i.ref == tag), None)
    if found is None:
        raise GpuprovError(f"committed {tag} but it is not listed as a baked image")
    report(f"{node.name}: baked {tag} ({found.size_gib} GiB) for lock {lock['hash']}")
    return found


def delete(image: Any, report: Reporter) -> None:
    users = docker("ps", "-aq", "--filter", f"ancestor={image.id}").stdout.decode().split()
    if users:
        raise BadInput(f"{image.ref} is in use by {len(users)} container(s); `gpuprov down` "
                       "their clusters first")
    docker("image", "rm", image.ref)
    report(f"removed {image.ref}")
