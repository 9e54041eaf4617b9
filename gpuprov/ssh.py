"""SSH keys, pinned host keys and reachability checks.

gpuprov never turns host key checking off: every node's host key is in the
cluster's own known_hosts before the first connection, and every SSH client
(OpenSSH for Ansible and the probes, paramiko for ``exec``) is told to
reject anything else.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from gpuprov import validate
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.node_text import printable
from gpuprov.state import NodeRecord

T = TypeVar("T")
MAX_PARALLEL = 16


def ensure_keypair(path: Path, comment: str) -> Path:
    """An ed25519 key pair at ``path`` (private 0600), created when absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    os.chmod(path, 0o600)
    return path


def new_host_key(workdir: Path, comment: str) -> tuple[bytes, str]:
    """A fresh ed25519 host key: (private key bytes, public key line)."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        key = Path(tmp) / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)])
        return key.read_bytes(), key.with_suffix(".pub").read_text().strip()


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def pinned_key(known_hosts: Path, address: str, port: int) -> str | None:
    """The key pinned for address:port in ``known_hosts`` ("type base64"), or None."""
    if not known_hosts.exists():
        return None
    name = known_hosts_name(address, port)
    for line in known_hosts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == name:
            return f"{parts[1]} {parts[2]}"
    return None


def pin_host_keys(known_hosts: Path, keys: Mapping[tuple[str, int], str]) -> None:
    """Write ``keys`` ({(address, port): "type base64 [comment]"}) into known_hosts.

    Entries for the same address:port are replaced (a re-created node has a
    new key); other entries are kept. Written atomically.
    """
    names = {known_hosts_name(a, p): key for (a, p), key in keys.items()}
    lines: list[str] = []
    if known_hosts.exists():
        for line in known_hosts.read_text().splitlines():
            host = line.split(" ", 1)[0]
            if line.strip() and host not in names:
                lines.append(line)
    for name, key in sorted(names.items()):
        # The last word on what becomes a line, whatever checked the address and key before: no
        # control character anywhere, and no space, comma or pattern character (* ? !) in the
        # host field, where it would name other hosts.
        if any(c.isspace() or c in ",*?!" for c in name):
            raise BadInput(f"known_hosts: a host {name!r} with a space, ',' or a pattern character")
        keytype, blob = key.split()[:2]
        lines.append(validate.one_line(f"{name} {keytype} {blob}", "known_hosts"))
    tmp = known_hosts.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(known_hosts)


def keyscan(address: str, port: int, timeout: int = 10) -> str:
    """The ed25519 host key a server offers (trust on first use, for static hosts)."""
    proc = subprocess.run(
        ["ssh-keyscan", "-T", str(timeout), "-t", "ed25519", "-p", str(port), "--", address],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            return f"{parts[1]} {parts[2]}"
    raise GpuprovError(
        f"{address}:{port} offered no ed25519 host key (ssh-keyscan: "
        f"{ssh_error_line(proc.stderr) if proc.stderr.strip() else 'no answer'})"
    )


def fingerprint(pubkey: str) -> str:
    proc = subprocess.run(
        ["ssh-keygen", "-l", "-f", "-"], input=pubkey + "\n", capture_output=True, text=True, check=False
    )
    return proc.stdout.split()[1] if proc.returncode == 0 and proc.stdout else "?"


def with_access(text: str, entries: Sequence[Mapping[str, str]]) -> str:
    """An ``authorized_keys`` file's ``text`` as the gpuprov_base role's access entry point
    leaves it (the nodes a play reaches; this for those that boot from an image, Slurm's
    dynamic nodes): each entry ({name, key, state}, every key checked whole when it was granted)
    matched by its key's blob, the second field; a ``present`` one in place of the lines holding
    it (else added at the end), an ``absent`` one removed; no other line is touched."""
    lines = text.splitlines()
    for entry in entries:
        blob = entry["key"].split()[1]
        holding = [i for i, line in enumerate(lines) if blob in line.split()]
        if entry["state"] == "present":
            if holding:
                lines[holding[0]] = entry["key"]
                lines = [line for i, line in enumerate(lines) if i not in holding[1:]]
            else:
                lines.append(entry["key"])
        else:
            lines = [line for i, line in enumerate(lines) if i not in holding]
    return "".join(f"{line}\n" for line in lines)


def ssh_options(known_hosts: Path, key: Path | None) -> list[str]:
    opts = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    if key is not None:
        opts += ["-o", "IdentitiesOnly=yes", "-i", str(key)]
    return opts


# A node record's ``login`` (its extra) when the node takes the user's own SSH keys (agent and
# default identities), not a key of the cluster's: a provider that records such nodes says so.
USER_KEYS = "user-keys"


def node_key(node: NodeRecord, default: Path) -> Path | None:
    """The private key for ``node``: its own (``key_file``), else None where the node logs in
    with the user's keys (``login``: USER_KEYS), else the cluster's."""
    if node.extra.get("key_file"):
        return Path(node.extra["key_file"]).expanduser()
    if node.extra.get("login") == USER_KEYS:
        return None
    return default


def wait_ssh(node: NodeRecord, key: Path | None, known_hosts: Path, timeout: float = 90.0) -> None:
    """Return once ``node`` runs a command over SSH with its pinned host key."""
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while True:
        proc = subprocess.run(
            [
                "ssh",
                "-p",
                str(node.ssh_port),
                *ssh_options(known_hosts, key),
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=5",
                # Options end here: nothing after this is read as one, whatever it holds.
                "--",
                f"{node.user}@{node.address}",
                "true",
            ],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode == 0:
            return
        last = ssh_error_line(proc.stderr, proc.returncode)
        if "Host key verification failed" in proc.stderr or "IDENTIFICATION HAS CHANGED" in proc.stderr:
            raise GpuprovError(
                f"{node.name}: host key does not match the pinned key "
                f"({node.address}:{node.ssh_port}); refusing to connect"
            )
        if time.monotonic() > deadline:
            raise GpuprovError(
                f"{node.name}: SSH not reachable at {node.user}@{node.address}:{node.ssh_port} "
                f"after {timeout:.0f}s ({last})"
            )
        time.sleep(1.0)


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GpuprovError(f"{cmd[0]} failed: {proc.stderr.strip()}")


# -- one reachability check per node, before a command works on it ----------------------------
HOST_KEY_MISMATCH = "host key does not match the pinned key"
_MISMATCH_MARKERS = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED",
                     # Mitogen for Ansible's words for it (GPUPROV_ANSIBLE_STRATEGY=mitogen)
                     "SSH reported an unrecognized or mismatching host key")


def ssh_error_line(stderr: str, returncode: int | None = None) -> str:
    """One line for an SSH failure: a host key mismatch said plainly, else OpenSSH's last
    meaningful line of stderr (its warnings and blank lines left out)."""
    if any(m in stderr for m in _MISMATCH_MARKERS):
        return f"{HOST_KEY_MISMATCH} (Host key verification failed); refused, nothing ran on this node"
    lines = [printable(line.strip()) for line in stderr.replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line and not line.startswith(("Warning:", "@@@"))]
    if lines:
        return lines[-1]
    return "ssh failed" + (f" (exit {returncode})" if returncode is not None else "")


# Answers that are final: asking again cannot change them.
_FINAL_SSH_ERRORS = ("Host key verification failed", "IDENTIFICATION HAS CHANGED", "Permission denied")


def check_ssh(node: NodeRecord, key: Path | None, known_hosts: Path, timeout: int = 5,
              attempts: int = 3) -> str | None:
    """An SSH connection to ``node`` with its pinned host key: None when it runs a command,
    else why not, in one line. A transient failure (a reset or refused connection on a busy
    machine) is tried again, up to ``attempts`` times a second apart; a key mismatch or a
    refused login is final at once."""
    cmd = [
        "ssh",
        "-p",
        str(node.ssh_port),
        *ssh_options(known_hosts, key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={timeout}",
        # A fresh connection: a multiplexed master opened earlier would skip the key check.
        "-o",
        "ControlMaster=no",
        "-o",
        "ControlPath=none",
        # Options end here: nothing after this is read as one, whatever it holds.
        "--",
        f"{node.user}@{node.address}",
        "true",
    ]
    why = "no attempt"
    for attempt in range(attempts):
        if attempt:
            time.sleep(1.0)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                  stdin=subprocess.DEVNULL, timeout=timeout * 3 + 5)
        except subprocess.TimeoutExpired:
            why = f"no answer from {node.address}:{node.ssh_port} within {timeout * 3 + 5}s"
            continue
        if proc.returncode == 0:
            return None
        why = ssh_error_line(proc.stderr, proc.returncode)
        if any(final in proc.stderr for final in _FINAL_SSH_ERRORS):
            break  # a wrong key or a refused login does not get better by asking again
    return why


def unreachable_nodes(nodes: list[NodeRecord], default_key: Path, known_hosts: Path,
                      timeout: int = 5) -> dict[str, str]:
    """Check every node once, in parallel: {node name: why it is unreachable} for the
    nodes that are not (an empty mapping when all answer)."""
    from concurrent.futures import ThreadPoolExecutor

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(nodes), 32)) as pool:
        answers = list(pool.map(
            lambda n: check_ssh(n, node_key(n, default_key), known_hosts, timeout), nodes))
    return {n.name: why for n, why in zip(nodes, answers, strict=True) if why is not None}


# -- one way to work on every node at once -----------------------------------------------------
def each_node(nodes: list[NodeRecord], check: Callable[[NodeRecord], T], *,
              workers: int = MAX_PARALLEL) -> list[T]:
    """``check`` on every node in a bounded pool; its results in node order. Every node that
    failed (a GpuprovError) is reported together, in node order, each named once, in one
    GpuprovError; other exceptions (bugs, Ctrl-C) propagate as they are."""
    from concurrent.futures import ThreadPoolExecutor

    if not nodes:
        return []
    problems: dict[int, str] = {}
    results: dict[int, T] = {}

    def one(index: int) -> None:
        node = nodes[index]
        try:
            results[index] = check(node)
        except GpuprovError as exc:
            text = str(exc)
            problems[index] = text if text.startswith(f"{node.name}:") else f"{node.name}: {text}"

    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), workers))) as pool:
        for future in [pool.submit(one, i) for i in range(len(nodes))]:
            future.result()
    if problems:
        raise GpuprovError("; ".join(problems[i] for i in sorted(problems)))
    return [results[i] for i in range(len(nodes))]
