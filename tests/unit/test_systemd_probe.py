"""A node without systemd (the real H100 and H200 machines of tests/fixtures/recordings ran a
small init as PID 1) gets one reason from the probes that need systemd, not a shell error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuprov.probes.nodefacts import require_systemd


class Host:
    """FIXTURE: the two things require_systemd reads, as testinfra's host answers them."""

    def __init__(self, booted: bool, init: str) -> None:
        self.booted, self.init = booted, init

    def file(self, path: str):
        assert path == "/run/systemd/system"
        return SimpleNamespace(is_directory=self.booted)

    def run(self, command: str):
        assert command == "cat /proc/1/comm"
        return SimpleNamespace(stdout=self.init + "\n", rc=0)


def test_a_node_without_systemd_is_named_as_such() -> None:
    with pytest.raises(AssertionError, match=r"expected a node run by systemd, found PID 1 'tini' "
                                             r"\(no /run/systemd/system\)"):
        require_systemd(Host(booted=False, init="tini"))


def test_a_systemd_node_passes() -> None:
    require_systemd(Host(booted=True, init="systemd"))
