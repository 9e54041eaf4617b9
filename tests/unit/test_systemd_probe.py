"""A node without systemd (the real H100 and H200 machines of tests/fixtures/recordings ran a
small init as PID 1) gets one reason from the probes that need systemd, not a shell error."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov.probes.nodefacts import require_systemd


class Host:
    """FIXTURE: the one command require_systemd runs, as a node's shell answers it (exit 0 where
    /run/systemd/system is a directory, else PID 1's name and exit 1)."""

    def __init__(self, booted: bool, init: str) -> None:
        self.booted, self.init = booted, init

    def run(self, command: str):
        assert command == "test -d /run/systemd/system && exit 0; cat /proc/1/comm; exit 1"
        return SimpleNamespace(stdout="", rc=0) if self.booted else SimpleNamespace(stdout=self.init + "\n", rc=1)


def test_a_node_without_systemd_is_named_as_such() -> None:
    with pytest.raises(AssertionError, match=r"expected a node run by systemd, found PID 1 'tini' "
                                             r"\(no /run/systemd/system\)"):
        require_systemd(Host(booted=False, init="tini"))


def test_a_systemd_node_passes() -> None:
    require_systemd(Host(booted=True, init="systemd"))


def test_this_machine_is_judged_by_its_own_pid_1() -> None:
    import testinfra

    host = testinfra.get_host("local://")
    if Path("/run/systemd/system").is_dir():
        require_systemd(host)
        return
    init = Path("/proc/1/comm").read_text().strip()
    with pytest.raises(AssertionError, match=f"found PID 1 '{re.escape(init)}'"):
        require_systemd(host)
