"""The controller's side of a pull bootstrap: an HTTP server for the nodes of one `up`.

Bound to the one address the nodes reach (the provider says which: the docker bridge's
gateway for local nodes), on a port the kernel picks, for the length of the bootstrap. Each
request names its node (``X-Gpuprov-Node``) and carries that node's token (``Authorization:
Bearer``, HMAC of the node's name under a key that lives only in this process); anything else
is refused with 403, and a node may only ever report as itself.

- ``GET /bundle/SHA256``: the bootstrap bundle (only the one of this bootstrap).
- ``POST /report``: ``{"from": N, "events": [...]}``, the node's events from its Nth on;
  the answer ``{"have": M}`` says how many of them the controller holds (the agent resends
  from there: a lost answer never loses or doubles an event). Each batch is signed
  (``X-Gpuprov-Signature``: gpuprov.pull.report_signature, under the node's report secret,
  over its sequence number ``X-Gpuprov-Seq`` and its body): a captured token alone cannot
  forge a report, and a batch replayed with a sequence number already seen is refused (409).

What a node sends is data to check, never to trust: a batch must have the agent's shape
(check_report: known events, typed fields, statuses pass/fail/skip, bounded strings and counts);
a signed batch that has not is answered 400 and fails that node alone, with the reason
(``failed``). No well-formed ``Content-Length``: 400 unread. A connection silent ``timeout_s``
or open ``deadline_s`` is dropped; past ``max_connections`` a new one gets 503 (agents retry).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuprov.pull import node_token, report_secret, report_signature

MAX_REPORT = 8 << 20  # bytes in one batch
MAX_BATCH = 500  # events in one batch (the agent sends up to 500)
MAX_EVENTS = 20_000  # events kept per node (a full-stack site.yml sends about 2 per task)
MAX_TEXT = 4096  # characters in one string (a task, a message, a probe's detail)
MAX_ROWS = 1000  # probe rows in one report
TIMEOUT_S = 30.0  # a connection silent this long is dropped
DEADLINE_S = 300.0  # a connection is closed this long after it was accepted, whatever it sends
MAX_CONNECTIONS = 128  # connections served at once
STATUSES = ("pass", "fail", "skip")  # a probe row's status, as gpuprov.probes.collect writes it
_CHUNK = 1 << 20  # the bundle goes out in chunks: the connection's timeout bounds each one
_DIGITS = re.compile(r"[0-9]{1,18}")


class BadReport(ValueError):
    """A report batch that is not what an agent sends: its one-line reason."""


class PullServer:
    def __init__(self, address: str, key: bytes, bundle: bytes, sha256: str, nodes: Iterable[str], *,
                 timeout_s: float = TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 max_events: int = MAX_EVENTS, deadline_s: float = DEADLINE_S) -> None:
        self.key, self.bundle, self.sha256 = key, bundle, sha256
        self.max_events = max_events
        self.events: dict[str, list[dict[str, Any]]] = {n: [] for n in nodes}
        self.seen: dict[str, float] = {}
        self.fetched: dict[str, int] = {}
        self.failed: dict[str, str] = {}  # node: why its reports were refused (it has failed)
        self.seq: dict[str, int] = {}  # node: the last sequence number taken
        self.refused = 0  # requests refused without counting against a node (403, 409, 400 unread)
        self.changed = threading.Condition()
        self.httpd = _Httpd((address, 0), _handler(self, timeout_s, deadline_s), max_connections)
        # Polled 10 times a second for its shutdown: the end of a bootstrap is not held up.
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def turned_away(self) -> int:
        """Connections answered 503 (past max_connections)."""
        return self.httpd.turned_away

    def __enter__(self) -> PullServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def add_nodes(self, nodes: Iterable[str]) -> None:
        with self.changed:
            for node in nodes:
                self.events.setdefault(node, [])

    # -- called from the handler's threads ------------------------------------------------
    def authorised(self, node: str, header: str) -> bool:
        # The token alone says who it is: only this process holds the key that makes one.
        if not node or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header.removeprefix("Bearer ").strip(), node_token(self.key, node))

    def signed(self, node: str, seq: str, signature: str, body: bytes) -> bool:
        if not _DIGITS.fullmatch(seq) or not signature:
            return False
        expected = report_signature(report_secret(self.key, node), int(seq), body)
        return hmac.compare_digest(signature.strip().encode(), expected.encode())

    def take(self, node: str, seq: int, report: Callable[[], tuple[int, list[dict[str, Any]]]]) -> tuple[int, dict]:
        """One signed batch of ``node``: (HTTP status, answer). ``report`` checks it (raises
        BadReport): a bad batch, or one past the node's event cap, fails the node."""
        with self.changed:
            if node in self.failed:
                return 400, {"error": f"this node has failed: {self.failed[node]}"}
            if seq <= self.seq.get(node, 0):
                self.refused += 1
                return 409, {"error": "sequence number already seen (a replayed batch)"}
            self.seq[node] = seq
            have = self.events.setdefault(node, [])
            self.seen[node] = time.monotonic()
            try:
                start, events = report()
                new = events[len(have) - start:] if start <= len(have) else []
                if len(have) + len(new) > self.max_events:
                    raise BadReport(f"more than {self.max_events} events from one node")
            except BadReport as exc:
                self.failed[node] = f"its report was refused: {exc}"
                self.changed.notify_all()
                return 400, {"error": str(exc)}
            for event in new:
                # A node reports as itself, whatever its events say.
                have.append({"event": event["event"], "event_data": {**event["event_data"], "host": node}})
            self.changed.notify_all()
            return 200, {"have": len(have)}

    # -- called by the controller ---------------------------------------------------------
    def wait(self, timeout: float) -> None:
        with self.changed:
            self.changed.wait(timeout)


class _Httpd(ThreadingHTTPServer):
    """A thread per connection, at most ``slots`` at once: past them a connection is answered
    503 and closed at once (its thread never starts)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], slots: int) -> None:
        self.slots = threading.BoundedSemaphore(slots)
        self.turned_away = 0
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.turned_away += 1
            body = b'{"error": "too many connections; try again"}'
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: 2\r\nConnection: close\r\nContent-Length: "
                                + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _handler(server: PullServer, timeout_s: float, deadline_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuprov-pull"
        sys_version = ""
        timeout = timeout_s  # each read and each write of the connection (socketserver sets it)

        def log_message(self, format: str, *args: Any) -> None:
            return  # no access log: the events are the record

        def setup(self) -> None:
            super().setup()
            # The whole connection's bound: a client that trickles a byte just inside the
            # per-read timeout is cut off here (shutting the socket wakes the blocked read).
            self.deadline = threading.Timer(deadline_s, self._cut)
            self.deadline.daemon = True
            self.deadline.start()

        def _cut(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def finish(self) -> None:
            self.deadline.cancel()
            super().finish()

        def _node(self) -> str | None:
            node = self.headers.get("X-Gpuprov-Node", "")
            if server.authorised(node, self.headers.get("Authorization", "")):
                return node
            server.refused += 1
            self._send(403, b'{"error": "not a node of this bootstrap"}')
            return None

        def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for at in range(0, len(body), _CHUNK):
                self.wfile.write(body[at:at + _CHUNK])

        def _length(self) -> int | None:
            given = self.headers.get_all("Content-Length") or []
            if len(given) != 1 or self.headers.get("Transfer-Encoding") or not _DIGITS.fullmatch(given[0].strip()):
                return None
            length = int(given[0])
            return length if 0 < length <= MAX_REPORT else None

        def do_GET(self) -> None:
            node = self._node()
            if node is None:
                return
            if self.path != f"/bundle/{server.sha256}":
                self._send(404, b'{"error": "no such bundle"}')
                return
            server.fetched[node] = server.fetched.get(node, 0) + 1
            self._send(200, server.bundle, "application/gzip")

        def do_POST(self) -> None:
            node = self._node()
            if node is None:
                return
            length = self._length()
            if self.path != "/report" or length is None:
                # Unread: what follows the headers is not known to be this request's body.
                self.close_connection = True
                server.refused += 1
                self._send(400, json.dumps({"error": f"a report is a POST to /report with a Content-Length of "
                                                     f"1 to {MAX_REPORT} bytes"}).encode())
                return
            body = self.rfile.read(length)
            seq = self.headers.get("X-Gpuprov-Seq", "").strip()
            if len(body) != length or not server.signed(node, seq, self.headers.get("X-Gpuprov-Signature", ""),
                                                        body):
                server.refused += 1
                self._send(403, b'{"error": "the report is not signed with this node\'s report secret"}')
                return
            status, answer = server.take(node, int(seq), lambda: check_report(body))
            self._send(status, json.dumps(answer).encode())

    return Handler


# -- what a report may hold -------------------------------------------------------------------
def check_report(body: bytes) -> tuple[int, list[dict[str, Any]]]:
    """A report batch's first event number and its events, each rebuilt from the fields its
    kind may have; BadReport (one line) for anything else."""
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
    return value


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


def _res(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReport(f"res must be an object, not {_show(value)}")
    return _fields(value, {"changed": _flag, "msg": _text}, required=())


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > 4:  # one node's stats (the callback names the node)
        raise BadReport(f"an object of node: count expected, not {_show(value)}")
    for host, count in value.items():
        _text(host, 256)
        if not _is_int(count) or count < 0:
            raise BadReport(f"a count expected, not {_show(count)}")
    return dict(value)


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
        if not _text(row["probe"], 256):
            raise BadReport("a probe row without a probe name")
        rows.append({"probe": row["probe"], "status": row["status"], "detail": _text(row["detail"])})
    return rows


_TASK = {"host": _text, "task": _text, "role": _text, "task_action": _text, "res": _res, "ignore_errors": _flag}
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
    "done": ({"host": _text, "rc": _rc, "refused": _flag, "converge_s": _seconds, "probes_s": _seconds}, ("rc",)),
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
    if kind not in _KINDS:
        raise BadReport(f"unknown event {_show(kind)}")
    if not isinstance(data, dict):
        raise BadReport(f"event_data must be an object, not {_show(data)}")
    allowed, required = _KINDS[kind]
    return {"event": kind, "event_data": _fields(data, allowed, required)}
