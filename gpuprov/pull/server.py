"""The controller's side of a pull bootstrap: an HTTP server for the nodes of one `up`.

Bound to the one address the nodes reach (the provider says which: the docker bridge's
gateway for local nodes), on a port the kernel picks, for the length of the bootstrap. Each
request names its node (``X-Gpuprov-Node``) and carries that node's token (``Authorization:
Bearer``, HMAC of the node's name under a key that lives only in this process); anything else
is refused with 403, and a node may only ever report as itself.

- ``GET /bundle/SHA256``: the bootstrap bundle (only the one of this bootstrap).
- ``POST /report``: ``{"from": N, "events": [...]}``, the node's events from its Nth on;
  the answer ``{"have": M}`` says how many of them the controller holds (the agent resends
  from there: a lost answer never loses or doubles an event).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuprov.pull import node_token

MAX_REPORT = 8 << 20


class PullServer:
    def __init__(self, address: str, key: bytes, bundle: bytes, sha256: str, nodes: Iterable[str]) -> None:
        self.key, self.bundle, self.sha256 = key, bundle, sha256
        self.events: dict[str, list[dict[str, Any]]] = {n: [] for n in nodes}
        self.seen: dict[str, float] = {}
        self.fetched: dict[str, int] = {}
        self.refused = 0
        self.changed = threading.Condition()
        self.httpd = ThreadingHTTPServer((address, 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

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

    def take(self, node: str, start: int, events: list[dict[str, Any]]) -> int:
        with self.changed:
            have = self.events.setdefault(node, [])
            self.seen[node] = time.monotonic()
            if start <= len(have):
                for event in events[len(have) - start:]:
                    data = event.get("event_data") if isinstance(event.get("event_data"), dict) else {}
                    # A node reports as itself, whatever its events say.
                    have.append({"event": str(event.get("event", "")), "event_data": {**data, "host": node}})
            self.changed.notify_all()
            return len(have)

    # -- called by the controller ---------------------------------------------------------
    def wait(self, timeout: float) -> None:
        with self.changed:
            self.changed.wait(timeout)


def _handler(server: PullServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuprov-pull"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            return  # no access log: the events are the record

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
            self.wfile.write(body)

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
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/report" or not 0 < length <= MAX_REPORT:
                self._send(400, b'{"error": "bad report"}')
                return
            try:
                body = json.loads(self.rfile.read(length))
                start, events = int(body["from"]), list(body["events"])
            except (ValueError, KeyError, TypeError):
                self._send(400, b'{"error": "bad report"}')
                return
            have = server.take(node, start, [e if isinstance(e, dict) else {} for e in events])
            self._send(200, json.dumps({"have": have}).encode())

    return Handler
