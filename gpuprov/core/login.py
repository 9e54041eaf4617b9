"""``gpuprov ssh`` and ``gpuprov ssh-config``: a login on one node with OpenSSH, and the
``~/.ssh/config`` block that lets plain ``ssh NODE`` and ``scp`` do the same; and which nodes a
command names (``ssh NAME NODE``, ``exec --node``/``--controller``).

Every connection is the one gpuprov itself makes: the cluster's pinned known_hosts alone (no
global file beside it), strict host key checking, the cluster's key (or the node's own), the
node's user, address and port as the provider reports them now. Nothing a user typed or a
record holds becomes an ssh option: every value is checked whole (gpuprov.validate), and ssh's
own options end with ``--`` before the destination.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuprov import ssh, validate
from gpuprov.cluster import load, reachable_nodes, refresh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles
from gpuprov.slurm import scheduler
from gpuprov.state import ClusterRecord, NodeRecord, Store

# Named in an unknown node's message; a fleet's other nodes are counted, not listed.
SHOWN_NODES = 8
# Beside the pinned known_hosts: no system-wide file whose entry could admit another key, and
# no multiplexed master (one opened by another ssh, checked against other files) reused.
ONLY_PINNED = ("-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none")


# -- which nodes -----------------------------------------------------------------------------------
def unknown_node(cluster: ClusterRecord, asked: str) -> BadInput:
    """One line for a node name the cluster does not have: the closest names, then its nodes."""
    names = [printable(n.name) for n in cluster.nodes]
    close = difflib.get_close_matches(asked, names, n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]}?" if close else ""
    shown = ", ".join(names[:SHOWN_NODES]) + (f" and {len(names) - SHOWN_NODES} more"
                                              if len(names) > SHOWN_NODES else "")
    return BadInput(f"cluster '{cluster.name}' has no node {asked!r}{hint} (its nodes: {shown or 'none'})")


def controller(cluster: ClusterRecord) -> str:
    """The Slurm controller's node name; BadInput on a cluster that runs no Slurm."""
    if scheduler.of(cluster).kind != "slurm":
        raise BadInput(f"cluster '{cluster.name}' runs no Slurm, so it has no controller; "
                       "name a node instead (--node NODE)")
    return scheduler.controller_of(cluster)


def login_node(cluster: ClusterRecord, asked: str | None) -> str:
    """The node `gpuprov ssh` logs in to: the one asked for, else the Slurm controller on a Slurm
    cluster, else the first node."""
    names = [n.name for n in cluster.nodes]
    if not names:
        raise BadInput(f"cluster '{cluster.name}' has no nodes to log in to")
    if asked is not None:
        if asked not in names:
            raise unknown_node(cluster, asked)
        return asked
    return controller(cluster) if scheduler.of(cluster).kind == "slurm" else names[0]


def exec_nodes(cluster: ClusterRecord, asked: Sequence[str], on_controller: bool) -> list[str] | None:
    """The node names `exec --node`/`--controller` picks, in the cluster's order (None: every
    node, as without them)."""
    if asked and on_controller:
        raise BadInput("--node and --controller: give one of them")
    if on_controller:
        return [controller(cluster)]
    if not asked:
        return None
    names = [n.name for n in cluster.nodes]
    for name in asked:
        if name not in names:
            raise unknown_node(cluster, name)
    return [n for n in names if n in asked]


def at_provider(cluster: ClusterRecord, nodes: list[NodeRecord], chosen: Sequence[str]) -> list[NodeRecord]:
    """The nodes named ``chosen`` as the provider reports them now (``nodes``), each running."""
    found = [n for n in nodes if n.name in chosen]
    missing = sorted(set(chosen) - {n.name for n in found})
    if missing:
        raise GpuprovError(f"{', '.join(missing)}: not at the provider now ({cluster.provider}); "
                           f"`gpuprov status {cluster.name}` shows the cluster's nodes")
    return reachable_nodes(cluster, found)


def command_line(words: Sequence[str]) -> str:
    """What the node's shell runs for ``words``: one word as it is (a shell line, `exec demo --
    'a; b'`), several quoted word by word. An empty or blank first word is refused: ssh given an
    empty command opens a login shell instead of running one."""
    if not words or not words[0].strip():
        raise BadInput(f"an empty command ({shlex.join(words[:1])}) after --: give the command to run")
    return shlex.join(words) if len(words) > 1 else words[0]


# -- a login with OpenSSH ---------------------------------------------------------------------------
def _path(path: Path, what: str, node: NodeRecord) -> str:
    return validate.ssh_config_word(str(path.absolute()), f"{node.name}: {what}")


def checked(node: NodeRecord) -> NodeRecord:
    """``node`` when every field that reaches ssh is what it should be (gpuprov.validate), its
    port a number (the address stays as recorded: it is the name its host key is pinned under)."""
    validate.host_name(node.name, "node")
    validate.user_name(node.user, f"{node.name}: user")
    validate.address(node.address, f"{node.name}: address")
    return dataclasses.replace(node, ssh_port=validate.port(node.ssh_port, f"{node.name}: port"))


def ssh_argv(node: NodeRecord, files: ClusterFiles, words: Sequence[str] = ()) -> list[str]:
    """The ssh command line for a login on ``node`` (no ``words``) or for one command on it."""
    node = checked(node)
    key = ssh.node_key(node, files.login_key)
    key = None if key is None else Path(_path(key, "key", node))
    known_hosts = Path(_path(files.known_hosts, "known_hosts", node))
    line = [command_line(words)] if words else []
    return ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(known_hosts, key), *ONLY_PINNED,
            # Options end here: nothing after this is read as one, whatever it holds.
            "--", f"{node.user}@{node.address}", *line]


@dataclass(frozen=True)
class Login:
    node: str  # the node's name
    argv: tuple[str, ...]  # the ssh command line, ssh's own options ended by "--"
    interactive: bool  # no command: a login shell


def login(name: str, node: str | None, words: Sequence[str], *, store: Store | None = None) -> Login:
    """`gpuprov ssh NAME [NODE] [-- WORDS]`, every check done before ssh runs: the command, the
    node named (or the default one), running, its fields, its host key pinned."""
    if words:
        command_line(words)
    store = store or Store()
    cluster = load(store, name)
    chosen = login_node(cluster, node)
    _, files, nodes = refresh(store, cluster)
    (found,) = at_provider(cluster, nodes, [chosen])
    argv = ssh_argv(found, files, words)
    if ssh.pinned_key(files.known_hosts, found.address, found.ssh_port) is None:
        raise GpuprovError(f"{chosen}: no host key is pinned for {found.address}:{found.ssh_port} in "
                           f"{files.known_hosts}; refused, nothing ran (`gpuprov up {name}` pins it)")
    return Login(node=chosen, argv=tuple(argv), interactive=not words)


def run(chosen: Login) -> int:
    """Run ssh: a login replaces this process (the terminal is ssh's alone), a command returns
    its exit code (ssh's 255 where ssh itself failed)."""
    try:
        if chosen.interactive:
            os.execvp(chosen.argv[0], list(chosen.argv))
        return subprocess.run(list(chosen.argv), check=False).returncode
    except FileNotFoundError:
        raise GpuprovError("ssh (the OpenSSH client) is not installed on this machine") from None


# -- ~/.ssh/config ------------------------------------------------------------------------------
def host_block(node: NodeRecord, files: ClusterFiles) -> list[str]:
    """One ``Host`` entry: ``ssh NODE`` as `gpuprov ssh` connects. Every value is one plain word
    (validate.ssh_config_word: whitespace, quotes, '#', '=', '%', '$' and control characters
    are refused, never quoted), so no record can add a line or an option to the file."""
    node = checked(node)
    key = ssh.node_key(node, files.login_key)
    # An address is one word too: an IPv6 zone id's '%' would be read as a token there.
    address = validate.ssh_config_word(node.address, f"{node.name}: address")
    lines = ["", f"Host {node.name}", f"    HostName {address}", f"    Port {node.ssh_port}",
             f"    User {node.user}"]
    if key is not None:  # else a static host reached with the user's agent and default keys
        lines += [f"    IdentityFile {_path(key, 'key', node)}", "    IdentitiesOnly yes"]
    return [*lines, f"    UserKnownHostsFile {_path(files.known_hosts, 'known_hosts', node)}",
            "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes"]


def ssh_config(name: str, *, store: Store | None = None) -> str:
    """`gpuprov ssh-config NAME`: a ``Host`` entry per node, named as the node, for
    ``~/.ssh/config``; every node checked before any text is made (BadInput: nothing printed)."""
    store = store or Store()
    cluster = load(store, name)
    _, files, nodes = refresh(store, cluster)
    if not nodes:
        raise BadInput(f"cluster '{name}' has no nodes")
    blocks = [f"# gpuprov cluster {name}: its nodes, their pinned host keys (gpuprov ssh-config {name})"]
    for node in nodes:
        blocks += host_block(node, files)
    return "\n".join(blocks) + "\n"
