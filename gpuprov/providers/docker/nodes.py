"""The flags a node's container runs with, a user's ids in a container, and removing single
local nodes (what one `up` added, or the old nodes of a roll onto an image): each node's
container (by its id) and its own /var/lib/docker volume; the rest of the cluster is
untouched."""

from __future__ import annotations

import io
import tarfile
import time

from gpuprov.errors import GpuprovError
from gpuprov.providers import Reporter
from gpuprov.providers.docker.engine import docker
from gpuprov.providers.docker.node_image import build_hint
from gpuprov.state import NodeRecord

# The flags that run systemd in a container on a cgroup v1/v2 host without
# --privileged (CAP_SYS_RESOURCE is not in every bounding set).
SYSTEMD_FLAGS = [
    "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "--stop-signal", "SIGRTMIN+3",
]


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


def _user_ids(container: str, user: str) -> tuple[int, int]:
    raw = docker("cp", f"{container}:/etc/passwd", "-").stdout
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        member = tar.extractfile("passwd")
        assert member is not None
        for line in member.read().decode().splitlines():
            fields = line.split(":")
            if fields[0] == user:
                return int(fields[2]), int(fields[3])
    raise GpuprovError(f"node image has no '{user}' user; rebuild it: {build_hint()}")


def _tar(files: list[tuple[str, bytes, int, int, int]], links: tuple[tuple[str, str], ...] = ()) -> bytes:
    """Files (path, bytes, mode, uid, gid) and symbolic links (path, target) as one tar, for
    `docker cp -` into a container."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data, mode, uid, gid in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, uid, gid, now
            tar.addfile(info, io.BytesIO(data))
        for path, target in links:
            link = tarfile.TarInfo(path)
            link.type, link.linkname, link.mtime = tarfile.SYMTYPE, target, now
            tar.addfile(link)
    return buf.getvalue()
