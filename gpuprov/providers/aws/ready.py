"""Addresses and readiness: pin each node's host key, wait for SSH, hand the host key over."""

from __future__ import annotations

import socket
import time

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles, Reporter
from gpuprov.providers.aws import api, hostkeys, userdata
from gpuprov.providers.aws.common import backoff, env_seconds
from gpuprov.state import NodeRecord


def wait_ready(nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
    """SSH with the pinned bootstrap key, then each node's own host key handed over
    (``hostkeys.hand_over``: idempotent, a node that has its own key is only checked)."""
    pin(nodes, files)
    deadline = time.monotonic() + env_seconds("GPUPROV_AWS_SSH_TIMEOUT", 600)

    def one(node: NodeRecord) -> None:
        try:
            wait_port(node.address, node.ssh_port, deadline)
        except GpuprovError as exc:
            tail = console_tail(node)
            raise GpuprovError(f"{exc}; {tail}" if tail else str(exc)) from None
        new = hostkeys.hand_over(
            node, files.login_key, files.known_hosts, bootstrap_key(node, files),
            hostkeys.own_key_file(files, node), timeout=max(5.0, deadline - time.monotonic()),
        )
        if new:
            report(f"{node.name}: SSH ready at {node.address}; host key handed over: the node's own "
                   f"key {ssh.fingerprint(new)} pinned, the bootstrap key removed from its sshd")
        else:
            report(f"{node.name}: SSH ready at {node.address} (its own host key, pinned)")

    # Instances boot together: up to 64 at once, so a large cluster's nodes share one deadline fairly.
    ssh.each_node(nodes, one, workers=64)
    return nodes


def console_tail(node: NodeRecord, lines: int = 6) -> str:
    """The last lines of the instance's console (GetConsoleOutput, the newest output where EC2
    has it), for a node that never answered: what its boot said, in one line; "" when EC2 has
    nothing or the call is not allowed. The text comes from the node: only printable
    characters reach the terminal."""
    try:
        aws = api.connect(node.extra.get("region"), attempts=2)
        # (botocore decodes the base64 EC2 sends: Output is text.)
        text = aws.ec2.get_console_output(InstanceId=node.id, Latest=True).get("Output") or ""
    except Exception:  # noqa: BLE001 (best effort: the SSH failure is the error reported)
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    clean = " | ".join(printable(line) for line in kept)
    return f"its console's last lines: {clean}" if clean else ""


def wait_port(address: str, port: int, deadline: float) -> None:
    """Until ``address:port`` accepts TCP, with exponential backoff (1 s to 20 s)."""
    if not address:
        raise GpuprovError("node has no public address")
    delay = backoff()
    while True:
        try:
            with socket.create_connection((address, port), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() + delay > deadline:
                raise GpuprovError(f"SSH port {address}:{port} not reachable in time ({exc})") from None
        time.sleep(delay)
        delay = min(delay * 2, 20.0)


def bootstrap_key(node: NodeRecord, files: ClusterFiles) -> str:
    path = userdata.first_contact_key(files, node.extra.get("batch", ""), node.extra.get("launch_index", 0))
    if not path.exists():
        raise GpuprovError(
            f"{node.name} ({node.id}): no recorded host key; it was not launched from this "
            "state directory, so gpuprov will not trust it (run `gpuprov down` and `up` again)"
        )
    return path.read_text().strip()


def pin(nodes: list[NodeRecord], files: ClusterFiles, strict: bool = True) -> None:
    """Pin each node's own host key when handed over, else its launch's bootstrap key."""
    keys = {}
    for node in nodes:
        path = hostkeys.own_key_file(files, node)
        if not path.exists():
            path = userdata.first_contact_key(files, node.extra.get("batch", ""), node.extra.get("launch_index", 0))
        if not path.exists():
            if strict:
                raise GpuprovError(
                    f"{node.name} ({node.id}): no recorded host key; it was not launched from this "
                    "state directory, so gpuprov will not trust it (run `gpuprov down` and `up` again)"
                )
            continue
        keys[(node.address, node.ssh_port)] = path.read_text().strip()
    if keys:
        with hostkeys.PIN_LOCK:
            ssh.pin_host_keys(files.known_hosts, keys)
