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
(gpuprov/pull/reports.py check_report: known events, typed fields, bounded strings and counts);
a signed batch that has not is answered 400 and fails that node alone, with the reason
(``failed``). No well-formed ``Content-Length``: 400 unread. A connection silent ``timeout_s``
or open ``deadline_s`` is dropped; past ``max_connections`` a new one gets 503 (agents retry).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from gpuprov.pull import node_token, report_secret, report_signature
from gpuprov.pull.reports import MAX_EVENTS, MAX_REPORT, BadReport, check_report

TIMEOUT_S = 30.0  # a connection silent this long is dropped
DEADLINE_S = 300.0  # a connection is closed this long after it was accepted, whatever it sends
MAX_CONNECTIONS = 128  # connections served at once
_CHUNK = 1 << 20  # the bundle goes out in chunks: the connection's timeout bounds each one
_DIGITS = re.compile(r"[0-9]{1,18}")


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
        assert isinstance(host, str)  # an AF_INET server: (host, port)
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
                # A node reports as itself, whatever its events say.
                new = [{"event": e["event"], "event_data": {**e["event_data"], "host": node}} for e in new]
            except Exception as exc:  # noqa: BLE001  (whatever it is, it is this node's: it fails it alone)
                why = str(exc) if isinstance(exc, BadReport) else f"could not be read ({type(exc).__name__})"
                self.failed[node] = f"its report was refused: {why}"
                self.changed.notify_all()
                return 400, {"error": why}
            have.extend(new)
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


class _Handler(BaseHTTPRequestHandler):
    """The pull channel's requests; ``pull``, ``timeout`` and ``deadline_s`` are set per server
    (``_handler``)."""

    pull: PullServer
    deadline_s: float = 0.0
    server_version = "gpuprov-pull"
    sys_version = ""
    timeout: ClassVar[float | None] = None  # each read and each write of the connection (socketserver sets it)

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log: the events are the record

    def setup(self) -> None:
        super().setup()
        # The whole connection's bound: a client that trickles a byte just inside the
        # per-read timeout is cut off here (shutting the socket wakes the blocked read).
        self.deadline = threading.Timer(self.deadline_s, self._cut)
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
        if self.pull.authorised(node, self.headers.get("Authorization", "")):
            return node
        self.pull.refused += 1
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
        if self.path != f"/bundle/{self.pull.sha256}":
            self._send(404, b'{"error": "no such bundle"}')
            return
        self.pull.fetched[node] = self.pull.fetched.get(node, 0) + 1
        self._send(200, self.pull.bundle, "application/gzip")

    def do_POST(self) -> None:
        node = self._node()
        if node is None:
            return
        length = self._length()
        if self.path != "/report" or length is None:
            # Unread: what follows the headers is not known to be this request's body.
            self.close_connection = True
            self.pull.refused += 1
            self._send(400, json.dumps({"error": f"a report is a POST to /report with a Content-Length of "
                                                 f"1 to {MAX_REPORT} bytes"}).encode())
            return
        body = self.rfile.read(length)
        seq = self.headers.get("X-Gpuprov-Seq", "").strip()
        if len(body) != length or not self.pull.signed(node, seq, self.headers.get("X-Gpuprov-Signature", ""),
                                                    body):
            self.pull.refused += 1
            self._send(403, b'{"error": "the report is not signed with this node\'s report secret"}')
            return
        status, answer = self.pull.take(node, int(seq), lambda: check_report(body))
        self._send(status, json.dumps(answer).encode())


def _handler(server: PullServer, timeout_s: float, deadline_s: float) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"pull": server, "timeout": timeout_s, "deadline_s": deadline_s})
