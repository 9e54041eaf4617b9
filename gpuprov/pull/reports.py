"""What a pull node's report batch may hold (the HTTP server, gpuprov/pull/server.py, and the
object store's reader, gpuprov/pull/objects.py, take a batch only through check_report): the
agent's events, each kind with its own typed fields, bounded strings and counts, probe statuses
pass/fail/skip, a manifest's digest and item count. Anything else is BadReport, whose one line
fails that node alone."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from gpuprov.node_text import printable

MAX_REPORT = 8 << 20  # bytes in one batch
MAX_BATCH = 500  # events in one batch (the agent sends up to 500)
MAX_EVENTS = 20_000  # events kept per node (a full-stack site.yml sends about 2 per task)
MAX_TEXT = 4096  # characters in one string (a task, a message, a probe's detail)
MAX_ROWS = 1000  # probe rows in one report
STATUSES = ("pass", "fail", "skip")  # a probe row's status, as gpuprov.probes.collect writes it


class BadReport(ValueError):
    """A report batch that is not what an agent sends: its one-line reason."""


def check_report(body: bytes) -> tuple[int, list[dict[str, Any]]]:
    """A report batch's first event number and its events, each rebuilt from the fields its
    kind may have; BadReport (one line) for anything else, whatever went wrong reading it."""
    try:
        return _check_report(body)
    except BadReport:
        raise
    except Exception as exc:  # noqa: BLE001  (a node's bytes: no fault in them escapes as another)
        raise BadReport(f"could not be read ({type(exc).__name__})") from None


def _check_report(body: bytes) -> tuple[int, list[dict[str, Any]]]:
    try:
        report = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadReport("not JSON") from None
    if not isinstance(report, dict) or set(report) != {"from", "events"}:
        raise BadReport(f"a report is an object of from and events, not {_show(report)}")
    start, events = report["from"], report["events"]
    if not _is_int(start) or start < 0:
        raise BadReport(f"from must be a count of events, not {_show(start)}")
    if not isinstance(events, list) or len(events) > MAX_BATCH:
        raise BadReport(f"events must be a list of at most {MAX_BATCH}")
    out = []
    for number, event in enumerate(events, start=start):
        try:
            out.append(_event(event))
        except BadReport as exc:
            raise BadReport(f"event {number}: {exc}") from None
    return start, out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str):
        raise BadReport(f"a string expected, not {_show(value)}")
    if len(value) > limit:
        raise BadReport(f"a string of {len(value)} characters (at most {limit})")
    return printable(value, lines=True)  # the node's words: nothing of them may act on a terminal


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadReport(f"true or false expected, not {_show(value)}")
    return value


def _rc(value: Any) -> int | None:
    if value is not None and not _is_int(value):
        raise BadReport(f"an exit status expected, not {_show(value)}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise BadReport(f"seconds expected, not {_show(value)}")
    return value


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _manifest(value: Any) -> dict[str, Any]:
    """The node's manifest as the agent wrote it: its digest and item count, or why none."""
    if isinstance(value, dict) and set(value) == {"error"}:
        return {"error": _text(value["error"])}
    if not (isinstance(value, dict) and set(value) == {"digest", "items"} and isinstance(value["digest"], str)
            and _SHA256.fullmatch(value["digest"]) and _is_int(value["items"]) and 0 <= value["items"] < 1 << 31):
        raise BadReport(f"a digest and an item count, or an error, expected, not {_show(value)}")
    return dict(value)


def _res(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReport(f"res must be an object, not {_show(value)}")
    return _fields(value, {"changed": _flag, "msg": _text, "report": _patch_report}, required=())


MAX_REPORT_ITEMS = 500  # entries in one list or mapping of a patch's report


def _patch_report(value: Any) -> dict[str, Any]:
    """node_patch's report (gpuprov.core.patch_plan.REPORT_TASK): a mapping of names to text,
    flags, counts, lists of text or mappings of text to text (package: version)."""
    if not isinstance(value, dict) or len(value) > 64:
        raise BadReport(f"a patch report is an object of at most 64 fields, not {_show(value)}")
    out: dict[str, Any] = {}
    for raw, item in value.items():
        key = _text(raw, 256)
        if isinstance(item, bool) or _is_int(item):
            out[key] = item
        elif isinstance(item, str):
            out[key] = _text(item)
        elif isinstance(item, list) and len(item) <= MAX_REPORT_ITEMS:
            out[key] = [_text(v) for v in item]
        elif isinstance(item, dict) and len(item) <= MAX_REPORT_ITEMS:
            out[key] = {_text(k, 256): _text(v) for k, v in item.items()}
        else:
            raise BadReport(f"a patch report's {_show(key)}: text, a flag, a count, or a list or map of "
                            f"at most {MAX_REPORT_ITEMS} texts, not {_show(item)}")
    return out


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > 4:  # one node's stats (the callback names the node)
        raise BadReport(f"an object of node: count expected, not {_show(value)}")
    for host, count in value.items():
        _text(host, 256)
        if not _is_int(count) or count < 0:
            raise BadReport(f"a count expected, not {_show(count)}")
    return {_text(host, 256): count for host, count in value.items()}


_ROW = {"probe", "status", "detail", "host"}


def _rows(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or len(value) > MAX_ROWS:
        raise BadReport(f"rows must be a list of at most {MAX_ROWS} probe rows")
    rows = []
    for row in value:
        # As gpuprov.probes.collect writes it (its host, testinfra's name for the node, is dropped).
        if not isinstance(row, dict) or not {"probe", "status", "detail"} <= set(row) <= _ROW:
            raise BadReport(f"a probe row is an object of probe, status and detail, not {_show(row)}")
        _text(row.get("host", ""), 256)
        if row["status"] not in STATUSES:
            raise BadReport(f"probe status {_show(row['status'])} (pass, fail or skip)")
        probe = _text(row["probe"], 256)
        if not probe:
            raise BadReport("a probe row without a probe name")
        rows.append({"probe": probe, "status": row["status"], "detail": _text(row["detail"])})
    return rows


_TASK: dict[str, Callable[[Any], Any]] = {"host": _text, "task": _text, "role": _text, "task_action": _text,
                                          "res": _res, "ignore_errors": _flag}
# Each event the agent and its callback send, the fields it may have, and those it must.
_KINDS: dict[str, tuple[dict[str, Callable[[Any], Any]], tuple[str, ...]]] = {
    **{kind: (_TASK, ("task",)) for kind in ("runner_on_start", "runner_on_ok", "runner_on_failed",
                                              "runner_on_skipped", "runner_on_unreachable")},
    "playbook_on_stats": ({"host": _text, **{k: _counts for k in ("ok", "changed", "failures", "dark", "skipped")}},
                          ()),
    "agent": ({"host": _text, "msg": _text}, ()),
    "refused": ({"host": _text, "msg": _text}, ("msg",)),
    "agent_failed": ({"host": _text, "msg": _text}, ("msg",)),
    "probes": ({"host": _text, "rows": _rows}, ("rows",)),
    "done": ({"host": _text, "rc": _rc, "refused": _flag, "converge_s": _seconds, "probes_s": _seconds,
              "manifest": _manifest}, ("rc",)),
}


def _fields(data: dict[str, Any], allowed: dict[str, Callable[[Any], Any]], required: Iterable[str]) -> dict[str, Any]:
    for key in required:
        if key not in data:
            raise BadReport(f"{key} missing")
    out = {}
    for key, value in data.items():
        check = allowed.get(key)
        if check is None:
            raise BadReport(f"unknown field {_show(key)}")
        try:
            out[key] = check(value)
        except BadReport as exc:
            raise BadReport(f"{key}: {exc}") from None
    return out


def _event(event: Any) -> dict[str, Any]:
    if not isinstance(event, dict) or set(event) != {"event", "event_data"}:
        raise BadReport(f"an event is an object of event and event_data, not {_show(event)}")
    kind, data = event["event"], event["event_data"]
    # The type first: a list or an object is no key to look up (unhashable: TypeError).
    if not isinstance(kind, str) or kind not in _KINDS:
        raise BadReport(f"unknown event {_show(kind)}")
    if not isinstance(data, dict):
        raise BadReport(f"event_data must be an object, not {_show(data)}")
    allowed, required = _KINDS[kind]
    return {"event": kind, "event_data": _fields(data, allowed, required)}
