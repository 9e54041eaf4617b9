"""Dynamic Slurm nodes on local containers: the host-side power service of one cluster.

Local nodes cannot start each other, so the cluster's power program (run by slurmctld on the
controller, roles/slurm/files/gpuprov-slurm-power) asks a service on this machine, listening on
the Docker bridge's gateway: a host-side service, named as such in docs/slurm.md. Each request
is checked first (gpuprov.slurm.elastic.verify: signature, age, replay, every name one of the
cluster's dynamic nodes); then ``resume`` boots each node from the cluster's image and hands it
what it needs to join (the munge key and gpuprov.slurm.elastic.node_files: no other node's
secret, no SSH key of the cluster's), ``suspend`` and ``fail`` remove it. The answer (202) goes
back before the work is done: slurmctld waits for the node to register, not for the program.

A dynamic node's container carries the cluster's label, so `down` removes it with the rest, and
the dynamic label, so it is never one of the nodes gpuprov bootstraps (Slurm owns its life).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable
from pathlib import Path

from gpuprov.errors import GpuprovError
from gpuprov.providers.docker import SYSTEMD_FLAGS, _tar, _user_ids
from gpuprov.providers.docker.engine import DYNAMIC_LABEL, LABEL, NODE_LABEL, docker
from gpuprov.slurm import elastic

MAX_BODY = 16384


def container_of(node: str) -> str:
    return f"gpuprov-{node}"


def boot(cluster: str, node: str, image: str, controller_addr: str, munge_key: Path) -> str:
    """Create and start ``node`` (a dynamic node of ``cluster``) from ``image``; its container's
    name. The image must be one baked from a node of the cluster (slurmd and munge installed)."""
    files = elastic.node_files(controller_addr, container=True)  # refuses a bad address first
    key = munge_key.read_bytes()
    cname = container_of(node)
    docker("create", "--name", cname, "--hostname", node, "--label", f"{LABEL}={cluster}",
           "--label", f"{NODE_LABEL}={node}", "--label", f"{DYNAMIC_LABEL}=1", *SYSTEMD_FLAGS,
           image, "/sbin/init")
    try:
        try:
            uid, gid = _user_ids(cname, "munge")
        except GpuprovError:
            raise GpuprovError(f"image {image} has no munge user: a dynamic node boots from an image baked "
                               "from a node of the Slurm cluster (`gpuprov image bake`)") from None
        docker("cp", "-a", "-", f"{cname}:/", input=_tar(
            [(path.lstrip("/"), data, mode, 0, 0) for path, data, mode in files]
            + [(elastic.MUNGE_KEY.lstrip("/"), key, 0o400, uid, gid)]))
        docker("start", cname)
    except GpuprovError:
        docker("rm", "-f", "-v", cname, check=False)
        raise
    return cname


def remove(nodes: list[str]) -> list[str]:
    """Remove the dynamic nodes' containers; the names of those that would not go."""
    stuck = []
    for node in nodes:
        cname = container_of(node)
        docker("rm", "-f", "-v", cname, check=False)
        if docker("ps", "-aq", "--filter", f"name=^{cname}$", check=False).stdout.strip():
            stuck.append(node)
    return stuck


class PowerService:
    """One cluster's service: verified requests handed to ``act(action, names)`` on a thread of
    their own; ``taken`` and ``refused`` say what came (for `status` and the tests)."""

    def __init__(self, address: str, cluster: str, count: int, key: bytes,
                 act: Callable[[str, tuple[str, ...]], None]) -> None:
        self.cluster, self.count, self.key, self.act = cluster, count, key, act
        self.seen = elastic.Seen()
        self.taken: list[elastic.PowerRequest] = []
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.httpd = http.server.ThreadingHTTPServer((address, 0), _handler(self))
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
        threading.Thread(target=self._run, args=(got,), daemon=True).start()
        return got

    def _run(self, got: elastic.PowerRequest) -> None:
        try:
            self.act(got.action, got.nodes)
        except GpuprovError as exc:  # said where the service reports; Slurm's timeout does the rest
            with self.lock:
                self.failed.append(f"{got.action} {got.hostlist}: {exc}")


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
