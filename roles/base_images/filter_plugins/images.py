"""Filters of the base_images role: where an image is pulled from when a mirror is set."""

from __future__ import annotations

from typing import Any


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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"mirrored": mirrored}
