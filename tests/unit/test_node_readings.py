"""The probes' one-command readings (gpuprov/probes/nodefacts.py) against this machine, over
testinfra's real local backend: the same commands a node runs, on real files."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path

import pytest
import testinfra

from gpuprov.probes.nodefacts import (
    exists,
    file_stat,
    held_packages,
    installed_version,
    once,
    parse_unit,
    read_text,
)

HOST = testinfra.get_host("local://")


def test_stat_reads_mode_owners_size_and_kind_at_once(tmp_path: Path) -> None:
    key = tmp_path / "munge key"  # a space: the path is one quoted word
    key.write_bytes(b"k" * 40)
    key.chmod(0o400)
    found = file_stat(HOST, str(key))
    assert found is not None
    assert (found.mode, found.size, found.kind) == (0o400, 40, "regular file")
    assert found.user == pwd.getpwuid(os.getuid()).pw_name
    assert found.group == grp.getgrgid(os.getgid()).gr_name
    assert file_stat(HOST, str(tmp_path)).kind == "directory"


def test_a_missing_file_is_none_not_an_error(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")
    assert file_stat(HOST, gone) is None
    assert read_text(HOST, gone) is None
    assert not exists(HOST, gone)


def test_read_text_returns_the_whole_text_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_SOCKET_IFNAME=^lo,docker\n# a comment; $(not run)\n")
    assert read_text(HOST, str(conf)) == conf.read_text()
    assert exists(HOST, str(conf))
    with pytest.raises(AssertionError, match="could not read"):
        read_text(HOST, str(tmp_path))  # a directory exists but is no text


def test_installed_version_of_a_package_this_machine_has_and_one_it_has_not() -> None:
    dpkg = HOST.run("dpkg-query -W -f '${Version}' dpkg")
    if dpkg.rc != 0:
        pytest.skip("this machine has no dpkg database to read")
    assert installed_version(HOST, "dpkg") == dpkg.stdout.strip()
    assert installed_version(HOST, "gpuprov-no-such-package") is None


def test_a_unit_is_running_and_enabled_by_systemctls_exit_codes() -> None:
    # What `systemctl is-active X; systemctl is-enabled X` print on a Debian 12 node
    # (tests/e2e's local nodes): running and enabled, static, stopped and disabled, unknown.
    running = parse_unit("munge", "active\nenabled\n0 0\n")
    assert (running.is_running, running.is_enabled) == (True, True)
    assert str(running) == "munge active, enabled"
    static = parse_unit("systemd-journald", "active\nstatic\n0 0\n")
    assert static.is_enabled
    stopped = parse_unit("slurmd", "inactive\ndisabled\n3 1\n")
    assert (stopped.is_running, stopped.is_enabled) == (False, False)
    unknown = parse_unit("nvidia-fabricmanager", "inactive\n3 1\n")
    assert str(unknown) == "nvidia-fabricmanager inactive, not found"
    with pytest.raises(AssertionError, match="unreadable state of unit slurmd"):
        parse_unit("slurmd", "System has not been booted with systemd\n")


def test_a_fact_is_read_once_per_host() -> None:
    calls: list[int] = []

    class Host:
        """FIXTURE: an object to remember facts on, as testinfra's host is."""

    host = Host()
    assert once(host, "pci", lambda: calls.append(1) or 8) == 8
    assert once(host, "pci", lambda: calls.append(1) or 0) == 8
    assert calls == [1]


def test_held_packages_are_what_apt_mark_showhold_lists_on_this_machine() -> None:
    """dpkg's selection `hold` read in one dpkg-query is apt-mark's own list (apt-mark is not
    asked by the probes: it loads apt's whole cache for it)."""
    if HOST.run("command -v apt-mark").rc != 0:
        pytest.skip("this machine has no apt-mark to compare with")
    assert held_packages(HOST) == frozenset(HOST.run("apt-mark showhold").stdout.split())


class _Answer:
    def __init__(self, stdout: str, rc: int = 0, stderr: str = "") -> None:
        self.stdout, self.rc, self.stderr = stdout, rc, stderr


class _Node:
    """FIXTURE: a node answering dpkg-query with the lines dpkg writes for the format the probe
    asks (want, then the package's name), as on a converged node: two held, one not."""

    def __init__(self, answer: _Answer) -> None:
        self.answer, self.asked = answer, 0

    def run(self, command: str, *args: str) -> _Answer:
        assert command.startswith("dpkg-query -W -f '${db:Status-Want} ${Package}")
        self.asked += 1
        return self.answer


def test_held_packages_are_read_once_per_node_and_only_hold_counts() -> None:
    node = _Node(_Answer("hold nvidia-driver-535\ninstall libnccl2\nhold libnccl2-dev\ndeinstall old\n"))
    assert held_packages(node) == {"nvidia-driver-535", "libnccl2-dev"}
    assert held_packages(node) == {"nvidia-driver-535", "libnccl2-dev"}
    assert node.asked == 1


def test_held_packages_fail_with_dpkgs_words_when_it_cannot_answer() -> None:
    with pytest.raises(AssertionError, match="database locked"):
        held_packages(_Node(_Answer("", rc=2, stderr="dpkg-query: database locked")))
