"""``gpuprov exec``: one command on every node at once, or on the nodes named, over fabric
(paramiko).

Host keys come only from the cluster's pinned known_hosts; an unknown or
changed key is refused (paramiko's RejectPolicy), never added.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from gpuprov.cluster import load, reachable_nodes, refresh
from gpuprov.console import Console
from gpuprov.core import login
from gpuprov.node_text import printable
from gpuprov.ssh import node_key
from gpuprov.state import Store


def _auth(key) -> dict:
    if key is None:  # a static host without a key: agent and default keys, as ssh would
        return {}
    return {"key_filename": str(key), "look_for_keys": False, "allow_agent": False}


def _shown(line: str) -> str:
    return printable(line.removesuffix("\r"), lines=True)


@dataclass(frozen=True)
class ExecResult:
    node: str
    exit_code: int
    error: str | None = None


class PrefixedStream:
    """A file-like that writes whole lines, each prefixed with the node's name, as text: what a
    node prints (a command's output is the node's words) reaches the terminal with every
    character it could act on made ``?`` (gpuprov/node_text.py; tabs kept, a CRLF's CR dropped)."""

    _lock = threading.Lock()

    def __init__(self, prefix: str, target: IO[str]) -> None:
        self.prefix, self.target, self.buffer = prefix, target, ""

    def write(self, data: str) -> int:
        self.buffer += data
        *lines, self.buffer = self.buffer.split("\n")
        if lines:
            with self._lock:
                for line in lines:
                    self.target.write(f"{self.prefix}{_shown(line)}\n")
                self.target.flush()
        return len(data)

    def flush(self) -> None:
        """Only what is whole: invoke flushes after every chunk it reads, and a line split
        across two chunks must still come out as one prefixed line (``end`` writes the rest)."""
        with self._lock:
            self.target.flush()

    def end(self) -> None:
        """The last line, even without its newline."""
        if self.buffer:
            with self._lock:
                self.target.write(f"{self.prefix}{_shown(self.buffer)}\n")
                self.target.flush()
            self.buffer = ""


def run(
    name: str, command: Sequence[str], *, console: Console, store: Store | None = None,
    names: Sequence[str] = (), on_controller: bool = False,
) -> list[ExecResult]:
    """``command`` on every node, or on those ``names`` (`--node`), or on the Slurm controller
    alone (`--controller`); the command and the names are checked before any node is asked."""
    line = login.command_line(command)
    store = store or Store()
    cluster = load(store, name)
    chosen = login.exec_nodes(cluster, names, on_controller)
    _, files, nodes = refresh(store, cluster)
    nodes = reachable_nodes(cluster, nodes) if chosen is None else login.at_provider(cluster, nodes, chosen)
    width = max(len(n.name) for n in nodes)

    def one(node) -> ExecResult:
        import paramiko
        from fabric import Connection

        out = PrefixedStream(f"{node.name:<{width}} | ", sys.stdout)
        err = PrefixedStream(f"{node.name:<{width}} ! ", sys.stderr)
        conn = Connection(
            host=node.address,
            port=node.ssh_port,
            user=node.user,
            connect_timeout=15,
            connect_kwargs=_auth(node_key(node, files.login_key)),
        )
        conn.client.get_host_keys().clear()
        conn.client.load_host_keys(str(files.known_hosts))
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            result = conn.run(
                line, warn=True, hide=False, pty=False, in_stream=False, out_stream=out, err_stream=err
            )
            return ExecResult(node.name, result.exited)
        except Exception as exc:  # noqa: BLE001  (any SSH failure is reported per node)
            return ExecResult(node.name, 255, f"{type(exc).__name__}: {exc}")
        finally:
            out.end()
            err.end()
            conn.close()

    with ThreadPoolExecutor(max_workers=min(len(nodes), 32)) as pool:
        results = list(pool.map(one, nodes))
    for r in results:
        if r.error:
            console.say(f"{r.node}: {r.error}")
        elif r.exit_code:
            console.say(f"{r.node}: exit {r.exit_code}")
    return results
