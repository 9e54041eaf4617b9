"""The node program (gpuprov/manifest/node.py) run on each node in one SSH round trip: through
the cluster's pinned host keys (gpuprov.ssh), as root (sudo -n where the login is not root),
with ``python3 -I -S`` (no environment, no site-packages). The program goes as the command's
text, the request as JSON on stdin; neither holds anything a user typed."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import gpuprov
from gpuprov.node_text import printable_data
from gpuprov.ssh import MAX_PARALLEL, node_key, ssh_error_line, ssh_options
from gpuprov.state import NodeRecord

# How long one node may take to answer (a snapshot reads every managed file and package once).
TIMEOUT_S = 120


@cache
def program() -> bytes:
    """The node program's bytes: gpuprov's own file, the same bytes for the same source."""
    return (Path(__file__).resolve().parent / "node.py").read_bytes()


def program_digest() -> str:
    return hashlib.sha256(program()).hexdigest()


def identity() -> dict[str, str]:
    """What a manifest must have been written by to be read as one: this gpuprov and program."""
    return {"gpuprov": gpuprov.__version__, "program": program_digest()}


def command(action: str) -> str:
    """The node's shell command: the program as Python's -c text, run as root."""
    run = f"python3 -I -S -c {shlex.quote(program().decode())} {shlex.quote(action)}"
    return f'if [ "$(id -u)" = 0 ]; then exec {run}; else exec sudo -n {run}; fi'


@dataclass(frozen=True)
class Answer:
    """A node's answer (the program's JSON), or why there is none."""

    node: str
    data: dict[str, Any] | None
    error: str | None = None


def ask(node: NodeRecord, key: Path, known_hosts: Path, action: str, request: Mapping[str, Any]) -> Answer:
    argv = ["ssh", "-p", str(node.ssh_port), *ssh_options(known_hosts, node_key(node, key)),
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            # Options end here: nothing after this is read as one, whatever it holds.
            "--", f"{node.user}@{node.address}", command(action)]
    try:
        proc = subprocess.run(argv, input=json.dumps(dict(request)), capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return Answer(node.name, None, f"no answer within {TIMEOUT_S}s")
    if proc.returncode != 0:
        return Answer(node.name, None, ssh_error_line(proc.stderr, proc.returncode))
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Answer(node.name, None, "the manifest program answered no JSON")
    return Answer(node.name, printable_data(data) if isinstance(data, dict) else None,
                  None if isinstance(data, dict) else "the manifest program answered no object")


def ask_all(nodes: Sequence[NodeRecord], key: Path, known_hosts: Path, action: str,
            requests: Mapping[str, Mapping[str, Any]]) -> dict[str, Answer]:
    """``action`` on every node at once (bounded): {node: Answer}."""
    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), MAX_PARALLEL))) as pool:
        answers = list(pool.map(lambda n: ask(n, key, known_hosts, action, requests[n.name]), nodes))
    return {a.node: a for a in answers}


def snapshot(nodes: Sequence[NodeRecord], key: Path, known_hosts: Path,
             items: Mapping[str, list[dict[str, str]]], scope: str) -> dict[str, Answer]:
    """Each node's manifest written from its items: {node: Answer({"digest", "items"})}."""
    me = identity()
    return ask_all(nodes, key, known_hosts, "snapshot",
                   {n.name: {**me, "scope": scope, "items": items.get(n.name, [])} for n in nodes})


def check(nodes: Sequence[NodeRecord], key: Path, known_hosts: Path) -> dict[str, Answer]:
    """Each node compared with its manifest: {node: Answer({"state", "digest", "items", "drift"})}."""
    me = identity()
    return ask_all(nodes, key, known_hosts, "check", {n.name: me for n in nodes})
