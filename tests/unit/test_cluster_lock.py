"""The per-cluster lock (gpuprov.cluster.cluster_lock): one mutating command per cluster at a time,
across processes. The holder is always a real second process holding the real flock; the one
refused is this process, through the library and through the CLI."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuprov.cluster import cluster_lock
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.state import Store
from tests.conftest import ROOT, invoke
from tests.lock_holder import HOLDER

REFUSAL = re.compile(r"cluster 'demo' is busy: `gpuprov provision demo` \(pid (\d+)\) "
                     r"has held it since (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def _utc_second() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@contextmanager
def holder(command: str, name: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, command, name], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ.copy())
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        if proc.poll() is None:
            proc.communicate("\n", timeout=30)


def test_a_second_command_is_refused_naming_the_holders_command_pid_and_since(gpuprov_home, capsys) -> None:
    Store().create_cluster("demo", "static", {})
    before = _utc_second()
    with holder("provision", "demo") as proc:
        after = _utc_second()
        with pytest.raises(GpuprovError) as refused, cluster_lock("demo"):
            pytest.fail("the lock was taken twice")
        assert not isinstance(refused.value, BadInput) and refused.value.exit_code == 1
        found = REFUSAL.fullmatch(str(refused.value))
        assert found, str(refused.value)
        assert int(found[1]) == proc.pid
        since = datetime.strptime(found[2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert before <= since <= after + timedelta(seconds=1)
        # Through the CLI: refused at once, one line, exit 1, nothing printed on stdout.
        code, out, err = invoke(capsys, "provision", "demo", "-o", "json")
        assert code == 1 and out == ""
        assert err.splitlines() == [f"gpuprov: {refused.value}"], err
    # Released: the next command takes it and writes itself in.
    with cluster_lock("demo"):
        held = (gpuprov_home / "locks" / "demo.lock").read_text()
        assert f'"pid": {os.getpid()}' in held and "provision" not in held


def test_a_killed_holder_leaves_no_lock_behind(gpuprov_home) -> None:
    """kill -9 runs nothing of the holder's: the kernel drops its flock, and what it wrote in
    the lock file stops no one."""
    with holder("provision", "demo") as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert f'"pid": {proc.pid}' in (gpuprov_home / "locks" / "demo.lock").read_text()
    with cluster_lock("demo"):
        pass


def test_the_refusal_is_one_printable_line_whatever_the_lock_file_holds(gpuprov_home) -> None:
    """A lock file of an older gpuprov (the bare pid) or with garbage in it: the refusal still
    names what it can, on one line of printable text."""
    lock = Path(gpuprov_home) / "locks" / "demo.lock"
    with cluster_lock("demo"):
        pass
    for content, expected in (
        ("4242", "another gpuprov process (pid 4242) is changing it"),
        ('{"pid": "1; rm -rf /", "command": ["gpuprov", "x\\u001b[31m\\ny"], "since": "\\r\\n"}',
         "`gpuprov x?[31m?y` (pid ?) has held it since ??"),
        ("\x00\xff not json", "another gpuprov process (pid ?) is changing it"),
    ):
        lock.write_bytes(content.encode("latin-1"))
        with subprocess.Popen(["flock", "-x", str(lock), "cat"], stdin=subprocess.PIPE) as proc:
            try:
                _wait_held(lock)
                with pytest.raises(GpuprovError) as refused, cluster_lock("demo"):
                    pytest.fail("the lock was taken twice")
            finally:
                assert proc.stdin is not None
                proc.stdin.close()
        assert str(refused.value) == f"cluster 'demo' is busy: {expected}"


def _wait_held(lock: Path) -> None:
    """Until the flock(1) beside us holds the lock (observed, not slept on)."""
    import fcntl

    for _ in range(500):
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        time.sleep(0.01)
    raise AssertionError("flock(1) never took the lock")
