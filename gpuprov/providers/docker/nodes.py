"""Removing single local nodes (what one `up` added, or the old nodes of a roll onto an image):
each node's container (by its id) and its own /var/lib/docker volume; the rest of the cluster is
untouched."""

from __future__ import annotations

from gpuprov.providers import Reporter
from gpuprov.providers.docker.engine import docker
from gpuprov.state import NodeRecord


def remove(nodes: list[NodeRecord], report: Reporter) -> list[str]:
    """Remove ``nodes``; the ids of those that would not go."""
    stuck = []
    for node in nodes:
        report(f"{node.name}: removing container and its volume")
        docker("rm", "-f", "-v", node.id, check=False)
        container = str(node.extra.get("container") or "")
        if container:
            docker("volume", "rm", f"{container}-docker", check=False)
        if docker("ps", "-aq", "--filter", f"id={node.id}", check=False).stdout.strip():
            stuck.append(node.id)
    return stuck
