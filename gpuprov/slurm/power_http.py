"""The HTTP side of a cluster's power service: the power program's requests (POST /power,
signed) checked by gpuprov.slurm.elastic.verify and handed to ``act(action, names)`` on a
thread of their own. The answer (202) goes back before the work is done: slurmctld waits for
the node to register, not for the program. Standard library only: a leaf, used by the service
(gpuprov.core.power_service) with a provider's power_up and power_down."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable

from gpuprov.errors import GpuprovError
from gpuprov.slurm import elastic

MAX_BODY = 16384


class PowerService:
    """One cluster's service: verified requests handed to ``act(action, names)`` on a thread of
    their own; ``taken`` and ``refused`` say what came (for `status` and the tests)."""

    def __init__(self, address: str, cluster: str, count: int, key: bytes,
                 act: Callable[[str, tuple[str, ...]], None], port: int = 0,
                 log: Callable[[str], None] | None = None) -> None:
        self.cluster, self.count, self.key, self.act = cluster, count, key, act
        self.log = log or (lambda _line: None)
        self.seen = elastic.Seen()
        self.taken: list[elastic.PowerRequest] = []
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer((address, port), _handler(self))
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/power"

    def __enter__(self) -> PowerService:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def take(self, body: bytes, signature: str) -> elastic.PowerRequest:
        with self.lock:
            got = elastic.verify(self.key, body, signature, self.cluster, self.count, seen=self.seen)
            self.taken.append(got)
        self.log(f"{got.action} {got.hostlist}: taken")
        threading.Thread(target=self._run, args=(got,), daemon=True).start()
        return got

    def _run(self, got: elastic.PowerRequest) -> None:
        try:
            self.act(got.action, got.nodes)
        except GpuprovError as exc:  # said where the service reports; Slurm's timeout does the rest
            with self.lock:
                self.failed.append(f"{got.action} {got.hostlist}: {exc}")
            self.log(f"{got.action} {got.hostlist}: failed: {exc}")
        else:
            self.log(f"{got.action} {got.hostlist}: done")


def _handler(service: PowerService) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if self.path != "/power" or not 0 < length <= MAX_BODY:
                self._answer(400, "expected a power request")
                return
            body = self.rfile.read(length)
            try:
                got = service.take(body, self.headers.get("X-Gpuprov-Signature", ""))
            except GpuprovError as exc:
                with service.lock:
                    service.refused.append(str(exc))
                service.log(f"refused: {exc}")
                self._answer(403, str(exc))
                return
            self._answer(202, f"{got.action} {' '.join(got.nodes)}")

        def _answer(self, code: int, text: str) -> None:
            data = (text + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: object) -> None:
            pass

    return Handler
