"""Local nodes: systemd Debian 12 (or, with ``--os debian13``, Debian 13) containers, reached
over real SSH, for trying the whole flow
before paying for GPUs and for the project's own end-to-end tests (no GPU: type ``docker-node``).

Each node runs systemd as PID 1 (SYSTEMD_FLAGS, no ``--privileged``) on the default bridge
network; publishes SSH on 127.0.0.1 only; gets a host key generated here, pinned in the cluster's
known_hosts before first contact; keeps /var/lib/docker on a named volume of its own (removed
with the node). Everything carries the label ``gpuprov.cluster=<name>``: the engine, not the
state file, says what exists.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuprov import defaults, paths, ssh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import BootArchive, ClusterFiles, ClusterSpec, Orphans, Plan, Provider, Reporter
from gpuprov.providers.docker import images, power
from gpuprov.providers.docker.engine import DYNAMIC_LABEL, IMAGE_LABEL, LABEL, NODE_LABEL, docker
from gpuprov.providers.docker.images import delete
from gpuprov.providers.docker.node_image import build_hint
from gpuprov.providers.docker.nodes import SYSTEMD_FLAGS, _tar, _user_ids, remove
from gpuprov.providers.docker.options import DEFAULT_IMAGE, NODE_IMAGES, SUITES, DockerOptions, unimaged
from gpuprov.state import NodeRecord

NODE_USER = "gpuprov"

# Local nodes are for trying things: a handful on one machine (each full-stack node holds
# about 3 GB and a systemd tree); more is a mistake to stop before any is made.
MAX_NODES = 16


class DockerProvider(Provider):
    name = "docker"
    display_name = "Docker"
    nodes_on_this_host = True  # (not billable: the default)
    pull_at_boot = True  # pull mode: the agent and its configuration copied in before start
    powers_nodes = True  # dynamic Slurm nodes: the host-side power service (docker/power.py)

    def __init__(self) -> None:
        self.image = os.environ.get("GPUPROV_NODE_IMAGE", DEFAULT_IMAGE)

    def image_for(self, os_name: str | None) -> str:
        """The node image of ``os_name`` (None: the default OS's; GPUPROV_NODE_IMAGE names
        that one's)."""
        if os_name in (None, defaults.DEFAULT_OS):
            return self.image
        return NODE_IMAGES[os_name]

    # -- checks -------------------------------------------------------------
    def check_engine(self) -> None:
        proc = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20)
        if proc.returncode != 0 or not proc.stdout.strip():
            detail = proc.stderr.decode().strip().splitlines()
            raise BadInput(
                "no Docker engine reachable"
                + (f" ({detail[-1]})" if detail else "")
                + "; start one with `systemctl start docker` (or `dockerd &`), "
                "or run `make host-setup`"
            )

    def check_image(self, image: str | None = None, os_name: str | None = None) -> None:
        own = self.image_for(os_name)
        image = image or own
        if docker("image", "inspect", image, check=False).returncode != 0:
            if image != own:
                raise BadInput(f"node image {image} not found (`gpuprov image list` shows the baked ones)")
            raise BadInput(f"node image {own} not found; {build_hint(own, SUITES.get(os_name or defaults.DEFAULT_OS))}")

    def _containers(self, cluster: str, dynamic: bool = True) -> list[dict]:
        """The cluster's containers (``dynamic``: with its dynamic Slurm nodes', which Slurm powers
        up and down: never counted, started or numbered as its nodes)."""
        proc = docker(
            "ps", "-a", "--no-trunc", "--filter", f"label={LABEL}={cluster}", "--format", "{{json .}}"
        )
        rows = [json.loads(line) for line in proc.stdout.decode().splitlines() if line.strip()]
        return rows if dynamic else [r for r in rows if not _labels(r).get(DYNAMIC_LABEL)]

    # -- interface ------------------------------------------------------------
    options_type = DockerOptions

    def check_spec(self, spec: ClusterSpec) -> ClusterSpec:
        spec = super().check_spec(spec)
        if spec.instance_type not in (None, "docker-node"):
            raise BadInput(
                f"the docker provider runs only the 'docker-node' type, not '{spec.instance_type}'"
            )
        if unimaged(spec.os):
            raise BadInput(unimaged(spec.os))
        if (spec.count or 0) > MAX_NODES:
            raise BadInput(
                f"--count {spec.count}: the docker provider runs at most {MAX_NODES} local nodes "
                "(each is a systemd container with the whole GPU stack, ~3 GB of disk)"
            )
        return replace(spec, instance_type="docker-node")

    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        spec = self.check_spec(spec)
        self.check_engine()
        self.check_image(spec.image, spec.os)
        return Plan(
            spec=spec,
            existing=len(self._containers(spec.name, dynamic=False)),
            billable=False,
            notes=("local containers: no GPU, no cost",),
        )

    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        spec = plan.spec
        ssh.ensure_keypair(files.key, f"gpuprov-{spec.name}")
        pubkey = files.key.with_suffix(".pub").read_text()
        existing = {c["Names"]: c for c in self._containers(spec.name, dynamic=False)}
        apt_proxy = ((spec.settings or {}).get("apt_proxy") or {}).get("value", "")
        created: list[str] = []
        boot = plan.pull
        if isinstance(boot, bool):  # a dry run's plan says whether nodes would pull; it never launches
            raise AssertionError("a launch's plan carries pull mode's boot configuration, not a flag")
        try:
            for cname, c in sorted(existing.items()):
                if c["State"] != "running":
                    report(f"{_labels(c).get(NODE_LABEL) or cname}: starting existing container")
                    docker("start", cname)
            # The new nodes take the lowest free numbers (a gap left by a removed node first).
            index = 0
            while len(created) < plan.to_create:
                index += 1
                cname = container_name(spec.name, index)
                if cname in existing:
                    continue
                node = node_name(spec.name, index)
                image = spec.image or self.image_for(spec.os)
                report(f"{node}: creating container from {image}")
                self._create(spec.name, node, cname, pubkey, files, apt_proxy, image, boot)
                created.append(cname)
            for cname in created:
                docker("start", cname)
            nodes = self.describe(spec.name, [], files)
            missing = [n.name for n in nodes if n.state != "running"]
            if missing or len(nodes) != len(existing) + plan.to_create:
                raise GpuprovError(f"nodes did not start: {', '.join(missing) or 'count mismatch'}")
        except BaseException:
            for cname in created:
                docker("rm", "-f", "-v", cname, check=False)
                docker("volume", "rm", f"{cname}-docker", check=False)
            if created:
                report(f"launch failed: removed the {len(created)} container(s) this run created")
            raise
        return nodes

    def _create(self, cluster: str, node: str, cname: str, pubkey: str, files: ClusterFiles,
                apt_proxy: str = "", image: str = DEFAULT_IMAGE,
                pull: BootArchive | None = None) -> str:
        volume = f"{cname}-docker"
        docker("volume", "create", "--label", f"{LABEL}={cluster}", volume)
        docker(
            "create",
            "--name",
            cname,
            "--hostname",
            node,
            "--label",
            f"{LABEL}={cluster}",
            "--label",
            f"{NODE_LABEL}={node}",
            *SYSTEMD_FLAGS,
            "-v",
            f"{volume}:/var/lib/docker",
            "-p",
            "127.0.0.1::22",
            image,
            "/sbin/init",
        )
        # The image's /etc/passwd says which uid owns the admin user's home.
        uid, gid = _user_ids(cname, NODE_USER)
        private, public = ssh.new_host_key(files.dir, f"root@{node}")
        (files.dir / "hostkeys").mkdir(mode=0o700, exist_ok=True)
        (files.dir / "hostkeys" / f"{node}.pub").write_text(public + "\n")
        payload = _tar(
            [
                ("etc/ssh/ssh_host_ed25519_key", private, 0o600, 0, 0),
                ("etc/ssh/ssh_host_ed25519_key.pub", (public + "\n").encode(), 0o644, 0, 0),
                (f"home/{NODE_USER}/.ssh/authorized_keys", pubkey.encode(), 0o600, uid, gid),
                *_apt_proxy_file(apt_proxy),
            ]
        )
        docker("cp", "-a", "-", f"{cname}:/", input=payload)
        if pull is not None:  # pull mode: the agent, its unit and this node's boot configuration
            docker("cp", "-a", "-", f"{cname}:/", input=pull.archive(node))
        return public

    def pull_address(self, spec: ClusterSpec, nodes: list[NodeRecord]) -> str:
        return bridge_gateway()

    def wait_ready(
        self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter
    ) -> list[NodeRecord]:
        self._pin(nodes, files)
        ssh.each_node(nodes, lambda n: ssh.wait_ssh(n, files.login_key, files.known_hosts))
        for n in nodes:
            report(f"{n.name}: SSH ready on 127.0.0.1:{n.ssh_port} (host key pinned)")
        return nodes

    def _pin(self, nodes: list[NodeRecord], files: ClusterFiles) -> None:
        keys = {}
        for n in nodes:
            pub = files.dir / "hostkeys" / f"{n.name}.pub"
            if not pub.exists():
                raise GpuprovError(
                    f"{n.name}: no recorded host key for this node; it was not created by "
                    "this state directory (run `gpuprov down` and `up` again)"
                )
            keys[(n.address, n.ssh_port)] = pub.read_text().strip()
        ssh.pin_host_keys(files.known_hosts, keys)

    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        rows = self._containers(name)
        if not rows:
            return []
        ids = [r["ID"] for r in rows]
        info = json.loads(docker("inspect", *ids).stdout)
        nodes = []
        for c in info:
            labels = c["Config"]["Labels"] or {}
            if labels.get(DYNAMIC_LABEL):
                continue  # a dynamic Slurm node: Slurm powers it up and down (docker/power.py)
            port = 0
            bindings = (c["NetworkSettings"]["Ports"] or {}).get("22/tcp") or []
            for b in bindings:
                if b.get("HostIp") in ("127.0.0.1", "") and b.get("HostPort"):
                    port = int(b["HostPort"])
            nodes.append(
                NodeRecord(
                    name=labels.get(NODE_LABEL, c["Name"].lstrip("/")),
                    id=c["Id"][:12],
                    address="127.0.0.1",
                    ssh_port=port,
                    user=NODE_USER,
                    state=c["State"]["Status"],
                    zone="local",
                    instance_type="docker-node",
                    extra={"container": c["Name"].lstrip("/"), "virtualization": "container",
                           "image": c["Config"]["Image"],
                           **({"image_lock": labels[IMAGE_LABEL]} if labels.get(IMAGE_LABEL) else {})},
                )
            )
        nodes.sort(key=lambda n: _index(n.name))
        if files.known_hosts.exists() or any(n.ssh_port for n in nodes):
            running = [n for n in nodes if n.ssh_port]
            if running and (files.dir / "hostkeys").is_dir():
                self._pin(running, files)
        return nodes

    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        rows = self._containers(name)
        for r in rows:
            report(f"{r['Names']}: removing container and its volumes")
        if rows:
            docker("rm", "-f", "-v", *[r["ID"] for r in rows])
        vols = docker("volume", "ls", "-q", "--filter", f"label={LABEL}={name}").stdout.decode().split()
        if vols:
            docker("volume", "rm", *vols)
        return len(rows)

    def find_orphans(self, name: str, region: str | None) -> Orphans | None:
        """Containers labelled with ``name`` (state wiped); None without a reachable engine."""
        try:
            self.check_engine()
            found = self.describe(name, [], ClusterFiles(paths.home() / "orphans"))
        except (BadInput, GpuprovError):
            return None
        if not found:
            return None
        return Orphans(provider=self.name, nodes=tuple(found),
                       found=f"{len(found)} docker node(s) carry its label",
                       removed="unrecorded docker node(s) removed")

    def destroy_orphans(self, name: str, orphans: Orphans, report: Reporter) -> int:
        return self.terminate(name, list(orphans.nodes), ClusterFiles(paths.home()), report)

    def terminate_nodes(self, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
        return remove(nodes, report)

    # -- dynamic Slurm nodes (gpuprov/providers/docker/power.py) ----------------------------
    def power_address(self) -> str:
        return bridge_gateway()

    def power_up(self, cluster: str, node: str, image: str, controller: NodeRecord, munge_key: Path,
                 access: Sequence[Mapping[str, str]] = ()) -> None:
        power.remove([node])  # a container left by a resume that failed goes first
        power.boot(cluster, node, image, power.address_of(str(controller.extra.get("container") or "")), munge_key,
                   login=(NODE_USER, access))

    def power_down(self, nodes: list[str]) -> list[str]:
        return power.remove(nodes)

    def power_nodes(self, cluster: str) -> list[str]:
        return power.running(cluster)

    def power_why(self, node: str) -> str:
        return power.why_not_registered(node)

    # -- baked images (gpuprov/providers/docker/images.py) -----------------------------------
    def baked_images(self, region: str | None = None) -> list[Any]:
        self.check_engine()
        return images.baked(images.repository())

    def bake(self, cluster: Any, node: NodeRecord, files: ClusterFiles, report: Reporter,
             copy_to: tuple[str, ...] = ()) -> Any:
        # (copy_to is refused before: copies_images is False)
        return images.bake(cluster, node, images.repository(), report)

    def delete_image(self, image: Any, report: Reporter) -> None:
        delete(image, report)


def bridge_gateway() -> str:
    """The docker bridge's gateway: the address at which local nodes reach this machine."""
    proc = docker("network", "inspect", "bridge", "-f",
                  "{{range .IPAM.Config}}{{.Gateway}}{{end}}", check=False)
    gateway = proc.stdout.decode().strip()
    if not gateway:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True,
                             text=True, check=False).stdout.split()
        gateway = out[3].split("/")[0] if len(out) > 3 else ""
    return gateway or "172.17.0.1"


def node_name(cluster: str, index: int) -> str:
    return f"{cluster}-node-{index}"


def container_name(cluster: str, index: int) -> str:
    return f"gpuprov-{cluster}-node-{index}"


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _apt_proxy_file(proxy: str) -> list[tuple[str, bytes, int, int, int]]:
    """Point the node's apt at the package cache the cluster's settings name (apt_proxy).

    Hosts on the bridge gateway itself (the artifact mirror, test repositories)
    are reached directly.
    """
    proxy = proxy.strip()
    if not proxy:
        return []
    gateway = proxy.split("//", 1)[-1].split(":", 1)[0]
    text = f'Acquire::http::Proxy "{proxy}";\nAcquire::http::Proxy::{gateway} "DIRECT";\n'
    return [("etc/apt/apt.conf.d/01gpuprov-proxy", text.encode(), 0o644, 0, 0)]


PROVIDER = DockerProvider()

__all__ = ["LABEL", "PROVIDER", "DockerProvider"]


def _labels(row: dict[str, Any]) -> dict[str, str]:
    """A `docker ps --format json` row's labels ("k=v,k2=v2") as a mapping."""
    return dict(kv.split("=", 1) for kv in str(row.get("Labels") or "").split(",") if "=" in kv)
