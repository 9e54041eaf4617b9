"""The controller's side of pull mode through an object store (AWS: the cluster's S3 bucket).

The nodes cannot reach this machine: each writes its numbered report batches as objects
under its own prefix (``reports/NODE/SEQ-SIGNATURE.json``, through the presigned POST it
was given: the store refuses any other key), and this side lists them, reads the new ones
and takes them as the HTTP server takes a POST (gpuprov/pull/server.py): the same checks
(check_report), the same signature (report_signature under the node's report secret, over
the batch's sequence number and body), the same event cap. What fails a check fails that
node alone, with the reason. It offers what the follower reads of the server (``events``,
``seen``, ``failed``, ``add_nodes``, ``wait``), so a pull bootstrap is followed the same
way whichever channel carries it.

``channel``: the provider's (gpuprov.providers.aws.s3.Channel): ``report_prefix(node)``,
``list_reports()`` ({key: size}), ``read_object(key)``, ``delete_keys(keys)``.
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Iterable
from typing import Any

from gpuprov.pull import report_secret, report_signature
from gpuprov.pull.reports import MAX_EVENTS, MAX_REPORT, BadReport, check_report

POLL_S = 5.0  # the reports are listed at most this often (each listing is one request per 1000 objects)
READERS = 16  # new batches read at once
_NAME = re.compile(r"(?P<seq>[0-9]{8})-(?P<sig>[0-9a-f]{64})\.json")


class ObjectReports:
    def __init__(self, channel: Any, key: bytes, nodes: Iterable[str], *, poll_s: float = POLL_S,
                 max_events: int = MAX_EVENTS) -> None:
        self.channel, self.key, self.poll_s, self.max_events = channel, key, poll_s, max_events
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.seen: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.taken: dict[str, set[str]] = {}  # node: the keys already taken
        self.next_poll = 0.0
        self.add_nodes(nodes)

    def add_nodes(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self.events.setdefault(node, [])
            self.taken.setdefault(node, set())

    def wait(self, timeout: float) -> None:
        """Sleep ``timeout`` (at most until the next listing is due), then list if it is."""
        now = time.monotonic()
        if now < self.next_poll:
            time.sleep(min(timeout, self.next_poll - now))
        if time.monotonic() >= self.next_poll:
            self.poll()

    def poll(self) -> None:
        """One listing; the new batches read (READERS at once), each node's taken in its
        sequence order, and those taken removed from the store (the run's directory records
        them), so that the next listing holds only what is new."""
        from concurrent.futures import ThreadPoolExecutor

        self.next_poll = time.monotonic() + self.poll_s
        listed = self.channel.list_reports()
        new: dict[str, list[tuple[str, int]]] = {}
        for node in self.events:
            if node not in self.failed:
                prefix = self.channel.report_prefix(node)
                new[node] = sorted((k, size) for k, size in listed.items()
                                   if k.startswith(prefix) and k not in self.taken[node])
        wanted = [key for found in new.values() for key, size in found if size <= MAX_REPORT]
        with ThreadPoolExecutor(READERS) as pool:
            bodies = dict(zip(wanted, pool.map(self.channel.read_object, wanted), strict=True))
        taken = []
        for node, found in new.items():
            prefix = self.channel.report_prefix(node)
            for key, size in found:
                why = self._take(node, key[len(prefix):], size, bodies.get(key, b""))
                if why:
                    self.failed[node] = f"its report was refused: {why}"
                    break
                if key in self.taken[node]:
                    taken.append(key)
        if taken:
            self.channel.delete_keys(taken)

    def _take(self, node: str, name: str, size: int, body: bytes) -> str | None:
        """One object of ``node``'s: None once taken (or left for a later listing: a batch past
        a gap waits for the one before it); else why it fails the node."""
        found = _NAME.fullmatch(name)
        if found is None:
            return f"an object named {name[:80]!r} under its prefix (not a report batch)"
        if size > MAX_REPORT:
            return f"a batch of {size} bytes (at most {MAX_REPORT})"
        seq = int(found["seq"])
        expected = report_signature(report_secret(self.key, node), seq, body)
        if not hmac.compare_digest(found["sig"], expected):
            return f"batch {seq} is not signed with this node's report secret"
        try:
            start, events = check_report(body)
        except BadReport as exc:
            return str(exc)
        have = self.events[node]
        if start > len(have):
            return None  # the batch before it is not listed yet: taken at a later listing
        new = events[len(have) - start:]
        if len(have) + len(new) > self.max_events:
            return f"more than {self.max_events} events from one node"
        for event in new:
            # A node reports as itself, whatever its events say.
            have.append({"event": event["event"], "event_data": {**event["event_data"], "host": node}})
        self.taken[node].add(self.channel.report_prefix(node) + name)
        self.seen[node] = time.monotonic()
        return None
