"""The pure parts of the reachability check: one line per SSH failure, from OpenSSH, from
Ansible's unreachable events and from testinfra's CommandResult reprs."""

from __future__ import annotations

import io
import re
import socket
from pathlib import Path

from rich.console import Console as RichConsole

from gpuprov import ssh
from gpuprov.ansible.progress import PlaybookProgress, unreachable_reason
from gpuprov.cluster import check_reachable, unreachable_row
from gpuprov.core.patch import mark_unreachable
from gpuprov.probes.collect import command_failure
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import serialise
from gpuprov.state import NodeRecord

MISMATCH_STDERR = (
    "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\r\n"
    "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n"
    "IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\r\n"
    "Host key verification failed.\r\n"
)


def test_ssh_error_line_takes_the_last_line_and_names_a_key_mismatch() -> None:
    assert ssh.ssh_error_line(
        "Warning: Permanently added '[127.0.0.1]:2222' (ED25519) to the list of known hosts.\r\n"
        "ssh: connect to host 10.0.0.1 port 22: Connection timed out\r\n", 255,
    ) == "ssh: connect to host 10.0.0.1 port 22: Connection timed out"
    line = ssh.ssh_error_line(MISMATCH_STDERR, 255)
    assert line.startswith("host key does not match the pinned key") and "\n" not in line
    assert ssh.ssh_error_line("", 255) == "ssh failed (exit 255)"


def test_check_ssh_reports_a_closed_port_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    node = NodeRecord(name="n1", id="x", address="127.0.0.1", ssh_port=port, user="root",
                      state="running", zone="local")
    known = tmp_path / "known_hosts"
    known.write_text("")
    why = ssh.check_ssh(node, None, known, timeout=3)
    assert why is not None and "Connection refused" in why and "\n" not in why
    down = ssh.unreachable_nodes([node], tmp_path / "key", known, timeout=3)
    assert list(down) == ["n1"] and "Connection refused" in down["n1"]
    assert ssh.unreachable_nodes([], tmp_path / "key", known) == {}


def test_command_result_repr_becomes_one_line() -> None:
    ssh_lost = (r"RuntimeError: CommandResult(backend=<testinfra.backend.ssh.SshBackend object at "
                r"""0x7f85>, exit_status=255, command=b"sudo /bin/sh -c 'uname -s'", _stdout=b'', """
                r"_stderr=b'kex_exchange_identification: Connection closed by remote host\r\n"
                r"Connection closed by 127.0.0.1 port 32768\r\n')")
    assert command_failure(ssh_lost) == \
        "ssh failed (exit 255): Connection closed by 127.0.0.1 port 32768"
    missing = (r"RuntimeError: CommandResult(backend=<x>, exit_status=127, command=b'nvcc -V', "
               r"""_stdout=b'', _stderr=b"bash: line 1: nvcc: command not found\n")""")
    assert command_failure(missing) == "command failed (exit 127): bash: line 1: nvcc: command not found"
    assert command_failure("expected 8 GPUs, found 0") is None


def test_ansible_unreachable_message_is_the_ssh_error() -> None:
    res = {"msg": 'Task failed: Data could not be sent to remote host "127.0.0.1". Make sure this '
                  "host can be reached over ssh: kex_exchange_identification: read: Connection reset "
                  "by peer\r\nConnection reset by 127.0.0.1 port 32768\r\n", "unreachable": True}
    assert unreachable_reason(res) == "Connection reset by 127.0.0.1 port 32768"
    res = {"msg": "Failed to connect to the host via ssh: " + MISMATCH_STDERR}
    assert unreachable_reason(res).startswith("host key does not match the pinned key")


def test_progress_names_an_unreachable_node_once() -> None:
    out = io.StringIO()
    progress = PlaybookProgress(["a", "b"], "t", console=RichConsole(file=out, width=300))
    event = {"event": "runner_on_unreachable",
             "event_data": {"host": "a", "task": "Gathering Facts",
                            "res": {"msg": "Failed to connect to the host via ssh: ssh: connect to "
                                           "host 10.0.0.1 port 22: Connection timed out"}}}
    with progress:
        progress.handle(event)
        progress.handle(event)  # a task that ignores unreachable hosts reports it again
    lines = [line for line in out.getvalue().splitlines() if line.strip().startswith("a:")]
    # one line, and it says when in the run the node went away ([M:SS] since the play began)
    assert len(lines) == 1
    assert re.fullmatch(r"  a: UNREACHABLE ssh: connect to host 10\.0\.0\.1 port 22: "
                        r"Connection timed out \[\d+:\d\d\]", lines[0]), lines
    assert progress.errors() == {"a": "unreachable: ssh: connect to host 10.0.0.1 port 22: "
                                      "Connection timed out"}


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)


def test_check_reachable_splits_and_says_each_unreachable_node_once(monkeypatch, tmp_path) -> None:
    nodes = [NodeRecord(name=n, id=n, address="10.0.0.1", ssh_port=22, user="u", state="running")
             for n in ("n1", "n2", "n3")]
    monkeypatch.setattr(ssh, "unreachable_nodes", lambda ns, key, known: {"n2": "Connection refused"})
    console = _Console()
    up, down = check_reachable(ClusterFiles(tmp_path), nodes, console)  # type: ignore[arg-type]
    assert [n.name for n in up] == ["n1", "n3"] and down == {"n2": "Connection refused"}
    assert console.lines == ["  n2: UNREACHABLE Connection refused"]
    assert serialise(unreachable_row("Connection refused")) == {
        "probe": "reachable", "status": "fail", "detail": "unreachable: Connection refused"}


def test_an_unreachable_node_is_not_started_with_its_reason() -> None:
    state = {"status": "not-started", "changed": 0, "rebooted": False}
    mark_unreachable(state, "Connection refused")
    assert state["status"] == "not-started"
    assert state["error"] == state["plan_error"] == "unreachable: Connection refused"
