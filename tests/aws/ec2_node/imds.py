#!/usr/bin/python3
"""FIXTURE (gpuprov tests only; installed only in the emulated-EC2 node image that
tests/aws/ec2_nodes.py builds): the instance metadata service of one emulated EC2
instance, IMDSv2 only, bound to 169.254.169.254:80 on the node's loopback.

What it serves comes from files the test fixture writes on the test machine and
mounts read-only at /var/lib/gpuprov-fixture-imds: ``meta-data.json`` (path -> value),
``user-data`` (the launch's user-data, bytes), and, once a test posts an
interruption, ``spot-instance-action`` (EC2's notice JSON).

IMDSv2 as EC2 documents it (Amazon EC2 User Guide, "Use the Instance Metadata Service
to access instance metadata"): a session token from ``PUT /latest/api/token`` with
``X-aws-ec2-metadata-token-ttl-seconds`` between 1 and 21600 (else 400); every GET
must carry a live token in ``X-aws-ec2-metadata-token`` (else 401: IMDSv1 is off, as
gpuprov launches require with HttpTokens=required); an unknown path is 404, and so is
``spot/instance-action`` until an interruption is scheduled. The response hop limit is
not emulated: the address lives on the node's own loopback, so only the node's own
processes reach it (on EC2, gpuprov's hop limit 2 lets the node's containers reach it
too; nothing in gpuprov's tests asks from a container).
"""

import json
import secrets
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path("/var/lib/gpuprov-fixture-imds")
TOKENS: dict[str, float] = {}


def _meta() -> dict:
    try:
        return json.loads((DATA / "meta-data.json").read_text())
    except (OSError, ValueError):
        return {}


class Handler(BaseHTTPRequestHandler):
    server_version = "EC2ws"

    def _send(self, status: int, body: bytes = b"", kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token":
            return self._send(404)
        try:
            ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
        except ValueError:
            return self._send(400)
        if not 1 <= ttl <= 21600:
            return self._send(400)
        token = secrets.token_urlsafe(42)
        TOKENS[token] = time.monotonic() + ttl
        self.send_response(200)
        self.send_header("X-aws-ec2-metadata-token-ttl-seconds", str(ttl))
        self.send_header("Content-Length", str(len(token)))
        self.end_headers()
        self.wfile.write(token.encode())

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        if TOKENS.get(token, 0) < time.monotonic():
            return self._send(401)
        path = self.path.split("?", 1)[0]
        if path == "/latest/user-data":
            data = DATA / "user-data"
            return self._send(200, data.read_bytes(), "application/octet-stream") if data.exists() else self._send(404)
        if not path.startswith("/latest/meta-data/"):
            return self._send(404)
        key = path[len("/latest/meta-data/"):].strip("/")
        if key == "spot/instance-action":
            notice = DATA / "spot-instance-action"
            return self._send(200, notice.read_bytes(), "application/json") if notice.exists() else self._send(404)
        meta = _meta()
        if key in meta:
            return self._send(200, str(meta[key]).encode())
        prefix = f"{key}/" if key else ""
        below = sorted({k[len(prefix):].split("/")[0] + ("/" if "/" in k[len(prefix):] else "")
                        for k in meta if k.startswith(prefix)})
        return self._send(200, "\n".join(below).encode()) if below else self._send(404)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("169.254.169.254", 80), Handler).serve_forever()
