"""Baked node images: a verified node captured once per version lock, booted everywhere.

A baked image carries exactly what the cluster's version lock says a node must carry, so a
node booted from it converges with nothing to change and is proven by the same probes. Each
image is labelled (docker) or tagged (aws) with the lock's hash and the lock's fields; `up`
takes the newest image whose lock hash equals the cluster's lock, unless ``--image`` names
one or ``--no-baked`` forbids it.

Before capture the node's file system is cleaned by one fixed script
(gpuprov/data/bake-clean.sh): host keys, cloud-init's instance state, the machine id, every
authorized_keys file and registry credential, the cluster's apt proxy, logs, apt's lists,
shell histories, temporary files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.lock.lock_data import LockData

# The lock fields an image records beside its hash (labels on docker, tags on aws).
LOCK_FIELDS = ("driver", "source", "kernel_module", "cuda", "cudnn", "fabricmanager", "instance_type")


@dataclass(frozen=True)
class BakedImage:
    """One baked image, as its provider reports it."""

    id: str  # docker: the image id (sha256:...); aws: ami-...
    ref: str  # what a launch names: docker: repo:tag; aws: the AMI id
    provider: str
    lock_hash: str
    created: str  # ISO 8601, UTC
    source: str  # CLUSTER/NODE it was baked from
    lock: dict[str, str]  # LOCK_FIELDS as recorded with the image
    region: str | None = None
    size_gib: float | None = None
    # The OS the node ran (aws: the cluster's --os); None where the provider has one OS.
    os: str | None = None

    def public(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ImageChoice:
    """What `up` boots new nodes from, and why (one line for the plan)."""

    ref: str | None  # None: the provider's default image
    baked: BakedImage | None
    reason: str


def clean_script() -> str:
    return (Path(__file__).parent / "data" / "bake-clean.sh").read_text()


def now() -> str:
    return utc_text()


def lock_record(lock: LockData) -> dict[str, str]:
    return {k: str(lock.get(k) or "") for k in LOCK_FIELDS}


def newest_for(images: list[BakedImage], lock_hash: str) -> BakedImage | None:
    """The newest image baked for ``lock_hash`` (None when there is none)."""
    mine = [i for i in images if i.lock_hash == lock_hash]
    return max(mine, key=lambda i: (i.created, i.id)) if mine else None


def choose(images: list[BakedImage], lock: LockData, *, explicit: str | None,
           no_baked: bool, os: str | None = None) -> ImageChoice:
    """The image new nodes boot from: ``--image`` wins, ``--no-baked`` forbids a baked one,
    else the newest baked for the cluster's lock (and its OS, where images record one), else
    the provider's default."""
    if explicit:
        named = next((i for i in images if explicit in (i.ref, i.id)), None)
        if named is not None and named.lock_hash != lock["hash"]:
            return ImageChoice(explicit, named, f"{explicit} (--image; baked for lock {named.lock_hash}, "
                               f"not this cluster's lock {lock['hash']}: the bootstrap changes it)")
        return ImageChoice(explicit, named, f"{explicit} (--image)")
    if no_baked:
        return ImageChoice(None, None, "the default image (--no-baked: bootstrap from scratch)")
    found = newest_for([i for i in images if not (os and i.os and i.os != os)], lock["hash"])
    if found is None:
        return ImageChoice(None, None, f"the default image (no image baked for lock {lock['hash']}; "
                           "bootstrap from scratch)")
    return ImageChoice(found.ref, found, f"{found.ref} (baked for lock {found.lock_hash} from "
                       f"{found.source}, {found.created})")


def mismatched(nodes: list[Any], lock_hash: str | None) -> list[tuple[str, str]]:
    """(node, its image's lock) for each node booted from an image baked for another lock."""
    return [(n.name, n.extra["image_lock"]) for n in nodes
            if n.extra.get("image_lock") and lock_hash and n.extra["image_lock"] != lock_hash]
