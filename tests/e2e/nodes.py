"""Helpers of the end-to-end files that share a local cluster's nodes: its containers and
volumes by label, its state directory, a command in a node (the test's own hands, through
docker, not gpuprov's)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def labelled(name: str) -> tuple[list[str], list[str]]:
    """The cluster's containers and volumes (gpuprov labels both with its name)."""
    containers = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=gpuprov.cluster={name}"],
        capture_output=True, text=True, check=True).stdout.split()
    volumes = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=gpuprov.cluster={name}"],
        capture_output=True, text=True, check=True).stdout.split()
    return containers, volumes


def cleanup_labels(name: str) -> None:
    """Remove what a failed test left of the cluster (only this cluster's labelled things)."""
    containers, volumes = labelled(name)
    if containers:
        subprocess.run(["docker", "rm", "-f", "-v", *containers], capture_output=True, check=False)
    if volumes:
        subprocess.run(["docker", "volume", "rm", *volumes], capture_output=True, check=False)


def cluster_dir(env: dict[str, str], name: str) -> Path:
    return Path(env["GPUPROV_HOME"]) / "clusters" / name


def container(node: str) -> str:
    """The id of the node's container."""
    return subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def node_sh(node: str, command: str) -> str:
    """``command`` run by sh in the node, as root; its stdout."""
    return subprocess.run(["docker", "exec", container(node), "sh", "-c", command], capture_output=True,
                          text=True, check=False).stdout
