"""The artifact mirror serves while it builds (gpuprov/artifacts.py): a request for an artifact a
running build will write is held until it is there, or answered 503 with Retry-After once the hold
runs out (the roles' downloads retry); nothing is held for a build that is gone."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuprov import artifacts
from gpuprov.lock import stack


@contextmanager
def serving(directory: Path, hold_s: float) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), artifacts.handler_class(directory, hold_s))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def mark(directory: Path, pid: int, *paths: str) -> None:
    (directory / artifacts.BUILDING).write_text(json.dumps({"pid": pid, "paths": list(paths)}))


def test_a_request_for_an_artifact_being_built_is_held_until_it_is_there(tmp_path: Path) -> None:
    (tmp_path / "cudnn").mkdir()
    mark(tmp_path, os.getpid(), "cudnn/a.tar")

    def finish() -> None:
        time.sleep(0.6)
        (tmp_path / "cudnn" / "a.tar").write_bytes(b"the archive")
        (tmp_path / artifacts.BUILDING).unlink()

    threading.Thread(target=finish).start()
    with serving(tmp_path, hold_s=10) as url:
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/cudnn/a.tar", timeout=10) as answer:
            assert (answer.status, answer.read()) == (200, b"the archive")
        assert time.monotonic() - started >= 0.5


def test_past_the_hold_the_answer_is_503_with_retry_after(tmp_path: Path) -> None:
    mark(tmp_path, os.getpid(), "cudnn/a.tar")
    with serving(tmp_path, hold_s=0.5) as url:
        try:
            urllib.request.urlopen(f"{url}/cudnn/a.tar", timeout=10)
            raise AssertionError("served")
        except urllib.error.HTTPError as err:
            assert err.code == 503 and err.headers["Retry-After"] == "5"


def test_nothing_is_held_for_a_build_that_is_gone_or_a_path_it_does_not_name(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    mark(tmp_path, int(gone), "cudnn/a.tar")
    assert artifacts.building(tmp_path) == set()
    (tmp_path / "b.tar").write_bytes(b"b")
    with serving(tmp_path, hold_s=30) as url:
        started = time.monotonic()
        for path, code in (("/cudnn/a.tar", 404), ("/b.tar", 200)):
            try:
                code_seen = urllib.request.urlopen(f"{url}{path}", timeout=10).status
            except urllib.error.HTTPError as err:
                code_seen = err.code
            assert code_seen == code, path
        assert time.monotonic() - started < 5
    (tmp_path / artifacts.BUILDING).write_text("not json")
    assert artifacts.building(tmp_path) == set()


def test_a_build_names_the_quick_archives_first_and_cudnn_8_9_last(tmp_path: Path) -> None:
    wanted = list(artifacts.wanted(tmp_path))
    assert wanted[-1] == f"cudnn/{stack.data()['cudnn']['archive']}"
    assert len(wanted) == 1 + len([a for line in stack.data()["cuda"]
                                   for a in stack.data()["cuda"][line].get("archives", [])])
    assert artifacts.missing(tmp_path, artifacts.lines_of("default")) == [wanted[-1]]


def test_a_file_that_is_there_is_served_at_once_whatever_the_marker_says(tmp_path: Path) -> None:
    """A build writes beside a file and renames it: one that is there is whole, and a marker
    (a pid reused after a killed build) never holds it."""
    (tmp_path / "a.tar").write_bytes(b"whole")
    mark(tmp_path, os.getpid(), "a.tar")
    with serving(tmp_path, hold_s=30) as url:
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/a.tar", timeout=10) as answer:
            assert answer.read() == b"whole"
        assert time.monotonic() - started < 5
