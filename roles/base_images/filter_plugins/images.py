"""Filters of the base_images role: digest-pinned image references, and where an image is
pulled from when a mirror is set."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def image_path(image: str) -> str:
    """An image's path in its registry: nvidia/cuda:T -> nvidia/cuda:T, ubuntu:22.04 ->
    library/ubuntu:22.04, nvcr.io/nvidia/pytorch:T -> nvidia/pytorch:T."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return rest
    return image if rest else f"library/{image}"


def mirrored(image: str, mirror: str) -> str:
    """The reference to pull ``image`` by: from ``mirror`` when one is set."""
    mirror = mirror.split("://", 1)[-1].rstrip("/")
    return f"{mirror}/{image_path(image)}" if mirror else image


def split_ref(image: str) -> tuple[str, str, str]:
    """``repo[:tag][@sha256:...]`` -> (repo, tag, digest); tag and digest may be empty."""
    name, _, digest = image.partition("@")
    repo, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:  # no tag, or the colon was a registry's port
        repo, tag = name, ""
    return repo, tag, digest


def pinned_images(images: list[str], mirror: str = "", digests: dict[str, str] | None = None) -> list[dict]:
    """Each image as the role pulls it: by digest, never by tag.

    ``images`` are the lock's ``repo:tag@sha256:...`` (the tag is for people). ``digests``
    maps ``repo:tag`` to the digest a registry mirror serves instead (a fixture registry that
    re-pushed other content under the name); it applies only with a mirror. An image with no
    valid digest is refused.
    """
    digests = digests or {}
    out = []
    for image in images:
        repo, tag, digest = split_ref(str(image))
        name = f"{repo}:{tag}" if tag else repo
        override = bool(mirror) and name in digests
        if override:
            digest = str(digests[name])
        if not DIGEST.match(digest):
            raise AnsibleFilterError(
                f"image {image} is not pinned by digest (want {name}@sha256:<64 hex digits>): "
                "images are pulled by digest only")
        out.append({"image": str(image), "name": name, "tagged": bool(tag), "digest": digest,
                    "pull": f"{mirrored(repo, mirror)}@{digest}", "override": override})
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"mirrored": mirrored, "pinned_images": pinned_images}
