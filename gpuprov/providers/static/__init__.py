"""Hosts that already exist (on-prem, other clouds), read from an inventory file.

``up`` checks every host is reachable with its pinned host key and records
them; ``down`` forgets them and never touches the machines.

Accepted files (see inventory/static-hosts.example.yml and .ini; hosts_file.py reads them):

- gpuprov YAML: ``hosts: [{name, address, user, port, key, instance_type, gpus,
  host_key, root_free_gib, apt_keep_downloads}]`` plus optional top-level ``known_hosts`` and defaults for every host;
- any Ansible inventory, YAML or INI, read by ansible-core's own parser (groups, group
  vars, children, host ranges), with ``ansible_host``/``ansible_user``/``ansible_port``/
  ``ansible_ssh_private_key_file`` and ``gpuprov_gpus``/``gpuprov_instance_type``.

Host keys: ``host_key`` per host, or a ``known_hosts`` file that already holds
them; otherwise they are read once with ssh-keyscan, printed with their
fingerprints (trust on first use), and pinned from then on.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuprov import ssh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider, Reporter
from gpuprov.providers.static.options import StaticOptions
from gpuprov.state import NodeRecord

__all__ = ["PROVIDER", "StaticHost", "StaticProvider", "parse_hosts_file"]


def parse_hosts_file(path: str | None) -> tuple[Any, Path | None]:
    """gpuprov.providers.static.hosts_file.parse_hosts_file, imported when a hosts file is read:
    it loads ansible-core's inventory code (about 0.2 s), which `list`, `status` and every
    command that reads no hosts file do without."""
    from gpuprov.providers.static import hosts_file  # lazy: CLI start-up

    return hosts_file.parse_hosts_file(path)


def __getattr__(name: str) -> Any:
    if name == "StaticHost":
        from gpuprov.providers.static.hosts_file import StaticHost  # lazy: CLI start-up

        return StaticHost
    raise AttributeError(name)

class StaticProvider(Provider):
    name = "static"
    display_name = "static hosts"
    billable = False
    # Existing hosts are cheap and certain to reach: `up --no-bootstrap` still pins every
    # host key and checks it answers (no playbooks does not mean no trust).
    pins_without_bootstrap = True
    # The hosts exist already: `up` adopts them (no --count: all of them), `down` forgets them.
    adopts_existing = True
    options_type = StaticOptions

    def check_spec(self, spec: ClusterSpec) -> ClusterSpec:
        spec = super().check_spec(spec)
        if not spec.hosts_file:
            raise BadInput("--provider static needs --hosts FILE")
        return spec

    def bootstrap_count(self, spec: ClusterSpec) -> int:
        """The hosts the hosts file lists (static takes no --count: it adopts them all)."""
        return len(parse_hosts_file(spec.hosts_file)[0]) if spec.hosts_file else 0

    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        spec = self.check_spec(spec)
        hosts, _ = parse_hosts_file(spec.hosts_file)
        if spec.count and spec.count != len(hosts):
            raise BadInput(f"--count {spec.count} but the hosts file lists {len(hosts)} hosts")
        return Plan(
            spec=spec,
            existing=len(hosts),
            billable=False,
            notes=(
                f"{len(hosts)} existing host(s) from {spec.hosts_file}; "
                "gpuprov will not create or remove machines",
            ),
        )

    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        spec = plan.spec
        hosts, known = parse_hosts_file(spec.hosts_file)
        return [
            NodeRecord(
                name=h.name,
                id=h.name,
                address=h.address,
                ssh_port=h.port,
                user=h.user,
                # Listed, not yet proven: wait_ready makes it "reachable" once the host
                # answered with its pinned key (``up --no-bootstrap`` included).
                state="listed",
                zone="static",
                instance_type=h.instance_type or spec.instance_type or "",
                extra={
                    "key_file": str(Path(h.key).expanduser().resolve()) if h.key else None,
                    # A host without a key of its own takes the user's agent and default keys.
                    **({} if h.key else {"login": ssh.USER_KEYS}),
                    "gpus": h.gpus,
                    "host_key": h.host_key,
                    **({"root_free_gib": h.root_free_gib} if h.root_free_gib is not None else {}),
                    **({"apt_keep_downloads": h.apt_keep_downloads} if h.apt_keep_downloads is not None else {}),
                    "known_hosts": str(known) if known else None,
                },
            )
            for h in hosts
        ]

    def wait_ready(
        self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter
    ) -> list[NodeRecord]:
        keys: dict[tuple[str, int], str] = {}
        for n in nodes:
            # A key the user declared wins; then the one this cluster already pinned (a
            # re-run never trusts a new key on first sight again); only then first use.
            key = (n.extra.get("host_key") or _from_known_hosts(n)
                   or ssh.pinned_key(files.known_hosts, n.address, n.ssh_port))
            if key is None:
                key = ssh.keyscan(n.address, n.ssh_port)
                report(
                    f"{n.name}: pinned host key {ssh.fingerprint(key)} "
                    "(first use; give host_key or known_hosts in the hosts file to pin ahead)"
                )
            keys[(n.address, n.ssh_port)] = key
        ssh.pin_host_keys(files.known_hosts, keys)

        ssh.each_node(nodes, lambda n: ssh.wait_ssh(n, ssh.node_key(n, files.login_key), files.known_hosts, timeout=10))
        if spec.os is not None:
            releases = ssh.each_node(nodes, lambda n: _ssh_read(n, files, "cat /etc/os-release", "/etc/os-release"))
            for n, text in zip(nodes, releases, strict=True):
                check_os(n.name, spec.os, text)
        hardware = ssh.each_node(nodes, lambda n: _read_pci(n, files))
        ready = []
        for n, hw in zip(nodes, hardware, strict=True):
            node = replace(n, state="reachable", extra={**n.extra, "hardware": hw})
            kind = self.host_type(node)
            report(f"{n.name}: reachable at {n.user}@{n.address}:{n.ssh_port}; PCI bus: "
                   f"{len(hw['gpu_device_ids'])} NVIDIA GPU(s), {hw['nvswitches']} NVSwitch(es)"
                   f" -> {kind.name}")
            ready.append(node)
        return ready

    def host_type(self, node: NodeRecord) -> Any:
        """What one host is: its declared type (hosts file, else --type), or its declared GPU
        count, completed by what its PCI bus showed (catalog.from_hardware)."""
        from gpuprov import catalog

        declared = catalog.get(node.instance_type) if node.instance_type else None
        return catalog.from_hardware(node.extra.get("hardware"), declared,
                                     gpus=node.extra.get("gpus"))

    def host_types(self, spec: ClusterSpec, nodes: list[NodeRecord] | None = None) -> list[Any]:
        if nodes is None:
            # Before any host is reached: what the hosts file (or --type) declares.
            nodes = [NodeRecord(name=h.name, id=h.name, address=h.address, ssh_port=h.port,
                                user=h.user, state="listed",
                                instance_type=h.instance_type or spec.instance_type or "",
                                extra={"gpus": h.gpus})
                     for h in parse_hosts_file(spec.hosts_file)[0]]
        return [self.host_type(n) for n in nodes]

    def expectations(self, node: NodeRecord) -> dict[str, Any]:
        kind = self.host_type(node)
        return {
            **super().expectations(node),
            # Unknown (None) until the host declared a type or count, or its bus was read.
            "gpus": node.extra["gpus"] if node.extra.get("gpus") is not None
            else kind.gpu_count if (node.instance_type or "hardware" in node.extra) else None,
            "gpu_model": kind.gpu_model,
            "nvswitch": kind.nvswitch,
            "efa": kind.efa,
            "infiniband": kind.infiniband,
        }

    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        # Records written before ``login`` was recorded: a host without key_file took the user's keys.
        return [n if n.extra.get("key_file") or "login" in n.extra
                else replace(n, extra={**n.extra, "login": ssh.USER_KEYS}) for n in known]

    def pull_address(self, spec: ClusterSpec, nodes: list[NodeRecord]) -> str:
        """This machine's address on the route to the first host (the kernel's choice; no
        packet is sent). A loopback address (hosts reached through a local port forward)
        cannot be reached from the hosts: refused."""
        import socket

        target = nodes[0].address if nodes else parse_hosts_file(spec.hosts_file)[0][0].address
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect((target, 9))
                address = str(probe.getsockname()[0])
        except OSError as exc:
            raise BadInput(f"pull mode: no route from this machine to {target} ({exc.strerror})") from None
        if address.startswith("127.") or address == "::1":
            raise BadInput(f"pull mode: the hosts are reached at {target}, through this machine's "
                           "loopback; they could not reach its bundle server; use push")
        return address

    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        for n in known:
            report(f"{n.name}: forgotten (the machine is not touched)")
        return len(known)


def _read_pci(node: NodeRecord, files: ClusterFiles) -> dict[str, Any]:
    """The NVIDIA functions on the host's PCI bus (catalog.parse_pci), read over SSH with the
    pinned key."""
    from gpuprov import catalog

    return catalog.parse_pci(_ssh_read(node, files, catalog.PCI_READ, "its PCI bus"))


def _ssh_read(node: NodeRecord, files: ClusterFiles, command: str, what: str) -> str:
    """``command``'s output on the host, over SSH with the pinned key: a fixed command, nothing
    from the hosts file reaches it but the login."""
    proc = subprocess.run(
        ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.login_key)),
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}", command],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=60,
    )
    if proc.returncode != 0:
        raise GpuprovError(f"{node.name}: could not read {what} over SSH "
                           f"({ssh.ssh_error_line(proc.stderr, proc.returncode)})")
    return proc.stdout


def check_os(node: str, claimed: str, os_release: str) -> None:
    """`up --provider static --os X`: refused (BadInput, one line) where host ``node``'s
    /etc/os-release (its text) names another OS than platform ``claimed``."""
    from gpuprov import platforms

    value = {k: v.strip().strip('"') for k, v in
             (line.split("=", 1) for line in os_release.splitlines() if "=" in line)}
    distro, version = value.get("ID", ""), value.get("VERSION_ID", "")

    def runs(p: Any) -> bool:
        # Debian by its major release (12.7 is Debian 12), Ubuntu by the whole one (22.04).
        return p.distribution.lower() == distro and (
            version.split(".")[0] if distro == "debian" else version) == p.version

    want = platforms.get(claimed)
    if runs(want):
        return
    found = (value.get("PRETTY_NAME") or f"{distro} {version}".strip() or "no OS named by /etc/os-release")[:80]
    other = next((p.key for p in platforms.PLATFORMS if runs(p)), None)
    hint = f"use --os {other}" if other else "gpuprov's roles do not support it"
    raise BadInput(f"{node}: --os {claimed} claims {want.title}, but the host runs {found}; {hint}")


def _from_known_hosts(node: NodeRecord) -> str | None:
    path = node.extra.get("known_hosts")
    if not path:
        return None
    lookup = ssh.known_hosts_name(node.address, node.ssh_port)
    proc = subprocess.run(
        ["ssh-keygen", "-F", lookup, "-f", os.fspath(path)], capture_output=True, text=True, check=False
    )
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#") and parts[1] == "ssh-ed25519":
            return f"{parts[1]} {parts[2]}"
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            return f"{parts[1]} {parts[2]}"
    return None


PROVIDER = StaticProvider()
