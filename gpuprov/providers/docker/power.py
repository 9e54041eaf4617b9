"""Dynamic Slurm nodes on local containers: the host-side power service of one cluster.

Local nodes cannot start each other, so the cluster's power program (run by slurmctld on the
controller, roles/slurm/files/gpuprov-slurm-power) asks a service on this machine, listening on
the Docker bridge's gateway: a host-side service, named as such in docs/slurm.md
(gpuprov.core.power_service; its HTTP side gpuprov.slurm.power_http). Here is what it does with
a request it checked: ``boot`` starts a node from the cluster's image and hands it what it
needs to join (the munge key and gpuprov.slurm.elastic.node_files: no other node's secret, no
SSH key of the cluster's), ``remove`` removes it.

A dynamic node's container carries the cluster's label, so `down` removes it with the rest, and
the dynamic label, so it is never one of the nodes gpuprov bootstraps (Slurm owns its life).
"""

from __future__ import annotations

import io
import ipaddress
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.providers.docker.engine import DYNAMIC_LABEL, LABEL, NODE_LABEL, docker
from gpuprov.providers.docker.nodes import SYSTEMD_FLAGS, _tar, _user_ids
from gpuprov.slurm import elastic

# A node baked from the controller carries slurmctld: a dynamic node never runs it (masked).
SLURMCTLD_UNIT = "etc/systemd/system/slurmctld.service"


def container_of(node: str) -> str:
    return f"gpuprov-{node}"


def address_of(container: str) -> str:
    """A running container's address on the Docker bridge (where slurmd reaches slurmctld)."""
    raw = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
                 container).stdout.decode().split()
    for word in raw:
        try:
            return str(ipaddress.ip_address(word))
        except ValueError:
            continue
    raise GpuprovError(f"{container} has no address on a Docker network (is it running?)")


def boot(cluster: str, node: str, image: str, controller_addr: str, munge_key: Path,
         login: tuple[str, Sequence[Mapping[str, str]]] | None = None) -> str:
    """Create and start ``node`` (a dynamic node of ``cluster``) from ``image``; its container's
    name. The image must be one baked from a node of the cluster (slurmd and munge installed).
    ``login``: the login user and the operators' keys as the cluster's record has them now, put
    in that user's authorized_keys as a play would (gpuprov.ssh.with_access): a key revoked
    since the image was baked does not log in to a node booted from it."""
    files = elastic.node_files(controller_addr, container=True)  # refuses a bad address first
    key = munge_key.read_bytes()
    cname = container_of(node)
    docker("create", "--name", cname, "--hostname", node, "--label", f"{LABEL}={cluster}",
           "--label", f"{NODE_LABEL}={node}", "--label", f"{DYNAMIC_LABEL}=1", *SYSTEMD_FLAGS,
           image, "/sbin/init")
    try:
        try:
            uid, gid = _user_ids(cname, "munge")
        except GpuprovError:
            raise GpuprovError(f"image {image} has no munge user: a dynamic node boots from an image baked "
                               "from a node of the Slurm cluster (`gpuprov image bake`)") from None
        docker("cp", "-a", "-", f"{cname}:/", input=_tar(
            [(path.lstrip("/"), data, mode, 0, 0) for path, data, mode in files]
            + [(elastic.MUNGE_KEY.lstrip("/"), key, 0o400, uid, gid)] + _access_files(cname, login),
            links=((SLURMCTLD_UNIT, "/dev/null"),)))
        docker("start", cname)
    except GpuprovError:
        docker("rm", "-f", "-v", cname, check=False)
        raise
    return cname


def _access_files(cname: str, login: tuple[str, Sequence[Mapping[str, str]]] | None) -> list[
        tuple[str, bytes, int, int, int]]:
    """The login user's authorized_keys as the image has it, with the operators' keys applied."""
    if not login or not login[1]:
        return []
    user, access = login
    uid, gid = _user_ids(cname, user)
    path = f"home/{user}/.ssh/authorized_keys"
    proc = docker("cp", f"{cname}:/{path}", "-", check=False)
    text = ""
    if proc.returncode == 0:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            member = tar.extractfile("authorized_keys")
            text = member.read().decode() if member is not None else ""
    return [(path, ssh.with_access(text, access).encode(), 0o600, uid, gid)]


def remove(nodes: list[str]) -> list[str]:
    """Remove the dynamic nodes' containers; the names of those that would not go."""
    stuck = []
    for node in nodes:
        cname = container_of(node)
        docker("rm", "-f", "-v", cname, check=False)
        if docker("ps", "-aq", "--filter", f"name=^{cname}$", check=False).stdout.strip():
            stuck.append(node)
    return stuck


def running(cluster: str) -> list[str]:
    """The dynamic nodes of ``cluster`` that have a container now, by name."""
    out = docker("ps", "-a", "--filter", f"label={LABEL}={cluster}", "--filter", f"label={DYNAMIC_LABEL}=1",
                 "--format", "{{.Label \"" + NODE_LABEL + "\"}}").stdout.decode()
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def why_not_registered(node: str) -> str:
    """What the node's slurmd unit said of why it did not start, for the Reason of a node that
    did not register: the first check its quick health failed (its line ``FAIL CHECK: ...``),
    else the last line saying a failure, else the last line; "" where it says nothing."""
    proc = docker("exec", container_of(node), "journalctl", "--unit", "slurmd", "--lines", "20", "--no-pager",
                  "--output", "cat", check=False, timeout=30)
    lines = [ln.strip() for ln in proc.stdout.decode(errors="replace").splitlines() if ln.strip()]
    checks = [ln for ln in lines if ln.startswith("FAIL ")]
    if checks:
        return checks[0][:300]
    failed = [ln for ln in lines if "fail" in ln.lower()]
    return (failed or lines or [""])[-1][:300]
