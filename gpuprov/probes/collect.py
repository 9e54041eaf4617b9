"""pytest plugin: write each probe's outcome as a JSON line, as soon as it is known.

Loaded by ``gpuprov verify`` with ``-p gpuprov.probes.collect``; the file is
named by ``GPUPROV_PROBE_RESULTS``. With pytest-xdist the hook runs in the
controller, so lines are written by one process only.
"""

from __future__ import annotations

import ast
import json
import os
import re
from typing import Any

import pytest

from gpuprov.ssh import ssh_error_line


def _probe(report: pytest.TestReport) -> str:
    name = report.location[2].split("[", 1)[0]
    return name.removeprefix("test_")


def _host_from_id(nodeid: str) -> str:
    match = re.search(r"\[(?:ansible://)?([^\]]+)\]$", nodeid)
    return match.group(1) if match else "?"


# testinfra raises RuntimeError(CommandResult(...)) when a command it needed failed; its
# repr holds the backend object, the command and raw bytes. What matters is the exit
# status and the last line of stderr (255: ssh itself failed).
_COMMAND_RESULT = re.compile(r"CommandResult\(.*?exit_status=(-?\d+)", re.S)
_STDERR = re.compile(r"_stderr=(b?(?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"))", re.S)


def command_failure(text: str) -> str | None:
    """One line for a testinfra CommandResult repr in ``text``, or None when there is none."""
    match = _COMMAND_RESULT.search(text)
    if match is None:
        return None
    status = int(match.group(1))
    stderr = ""
    found = _STDERR.search(text, match.end())
    if found is not None:
        try:
            raw = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            raw = found.group(1)
        stderr = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    if status == 255:
        return f"ssh failed (exit 255): {ssh_error_line(stderr, status)}"
    lines = [line.strip() for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    return f"command failed (exit {status})" + (f": {lines[-1]}" if lines else "")


def _detail(report: pytest.TestReport) -> str:
    props = dict(report.user_properties)
    if report.passed:
        return str(props.get("detail", "ok"))
    longrepr: Any = report.longrepr
    if report.skipped and isinstance(longrepr, tuple):
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(longrepr)
    # A command testinfra needed failed (RuntimeError(CommandResult)): say which, in one line.
    # A probe's own assertion keeps its message, though pytest's explanation of it below the
    # message names a CommandResult (`assert out.rc == 0, "expected ..."`).
    failure = None if text.startswith(("AssertionError", "Failed: ")) else command_failure(text)
    if failure is not None:
        return failure
    first = text.strip().splitlines()[0] if text.strip() else "failed"
    for prefix in ("AssertionError: ", "Failed: "):
        first = first.removeprefix(prefix)
    return first


_IS_XDIST_WORKER = False


def pytest_configure(config: pytest.Config) -> None:
    # xdist workers forward their reports to the controller, which writes. (Not the
    # PYTEST_XDIST_WORKER variable: gpuprov itself may run inside someone's xdist worker.)
    global _IS_XDIST_WORKER
    _IS_XDIST_WORKER = hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("GPUPROV_PROBE_RESULTS")
    if not path or _IS_XDIST_WORKER:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        status = "pass" if report.passed else "skip" if report.skipped else "fail"
        host = dict(report.user_properties).get("host") or _host_from_id(report.nodeid)
        line = {"host": host, "probe": _probe(report), "status": status, "detail": _detail(report)}
        with open(path, "a") as fh:
            fh.write(json.dumps(line) + "\n")
