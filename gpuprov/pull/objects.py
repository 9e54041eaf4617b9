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
MAX_PER_POLL = 8  # a node's batches read at one listing (its agent writes one every 2 s at most)
_NAME = re.compile(r"(?P<seq>[0-9]{8})-(?P<sig>[0-9a-f]{64})\.json")


class ObjectReports:
    def __init__(self, channel: Any, key: bytes, nodes: Iterable[str], *, poll_s: float = POLL_S,
                 max_events: int = MAX_EVENTS) -> None:
        self.channel, self.key, self.poll_s, self.max_events = channel, key, poll_s, max_events
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.seen: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self.taken: dict[str, set[str]] = {}  # node: the keys already taken
        self.last_seq: dict[str, int] = {}  # node: the sequence number of the last batch taken
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
        """One listing, then for each node: what it listed checked by name and size before
        anything is read (a refusal fails the node unread), at most MAX_PER_POLL of its new
        batches read (READERS at once across nodes) and taken in their sequence order up to the
        first refusal, and those taken removed from the store (the run's directory records
        them), so that the next listing holds only what is new. Whatever goes wrong with one
        node's objects fails that node alone, with the reason."""
        from concurrent.futures import ThreadPoolExecutor

        self.next_poll = time.monotonic() + self.poll_s
        listed = self.channel.list_reports()
        plans: dict[str, list[tuple[int, str, str]]] = {}
        done: list[str] = []  # keys taken now, or superseded by a batch taken: removed unread
        for node in self.events:
            if node not in self.failed:
                try:
                    plans[node] = self._plan(node, listed, done)
                except Exception as exc:  # noqa: BLE001 - one node's listing fails that node
                    self._fail(node, exc)
        wanted = [key for plan in plans.values() for _, key, _ in plan]
        with ThreadPoolExecutor(READERS) as pool:
            bodies = dict(zip(wanted, pool.map(self._read, wanted), strict=True))
        for node, plan in plans.items():
            for seq, key, signature in plan:
                try:
                    body = bodies[key]
                    if isinstance(body, Exception):
                        raise body
                    why = self._take(node, seq, key, signature, body)
                except Exception as exc:  # noqa: BLE001 - whatever it is, it is this node's
                    why = _why(exc)
                if why:
                    self.failed[node] = f"its report was refused: {why}"
                    break
                if key in self.taken[node]:
                    done.append(key)
        if done:
            self.channel.delete_keys(done)

    def _plan(self, node: str, listed: dict[str, int], done: list[str]) -> list[tuple[int, str, str]]:
        """The new objects under ``node``'s prefix to read now, from the listing alone: each
        named as a batch and of at most MAX_REPORT bytes (else BadReport, nothing read), those
        at or below the last sequence number taken left unread (to ``done``), the first
        MAX_PER_POLL of the rest in sequence order."""
        prefix = self.channel.report_prefix(node)
        last = self.last_seq.get(node, 0)
        found = []
        for key, size in listed.items():
            if not key.startswith(prefix):
                continue
            if key in self.taken[node]:
                done.append(key)  # taken before (its removal failed, or it was written again)
                continue
            name = key[len(prefix):]
            match = _NAME.fullmatch(name)
            if match is None:
                raise BadReport(f"an object named {name[:80]!r} under its prefix (not a report batch)")
            if not isinstance(size, int) or not 0 <= size <= MAX_REPORT:
                raise BadReport(f"batch {int(match['seq'])} of {size} bytes (at most {MAX_REPORT})")
            if int(match["seq"]) <= last:
                done.append(key)  # an older batch than one taken: what it says is already held
            else:
                found.append((int(match["seq"]), key, match["sig"]))
        return sorted(found)[:MAX_PER_POLL]

    def _read(self, key: str) -> bytes | Exception:
        try:
            return self.channel.read_object(key)
        except Exception as exc:  # noqa: BLE001 - handed back: it fails the object's node alone
            return exc

    def _fail(self, node: str, exc: Exception) -> None:
        self.failed[node] = f"its report was refused: {_why(exc)}"

    def _take(self, node: str, seq: int, key: str, signature: str, body: bytes) -> str | None:
        """One batch of ``node``'s, its name and size already checked: None once taken (or left
        for a later listing: a batch past a gap waits for the one before it); else why it
        fails the node."""
        if not isinstance(body, bytes) or len(body) > MAX_REPORT:
            return f"batch {seq} is not what was listed (at most {MAX_REPORT} bytes)"
        expected = report_signature(report_secret(self.key, node), seq, body)
        if not hmac.compare_digest(signature, expected):
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
        self.taken[node].add(key)
        self.last_seq[node] = seq
        self.seen[node] = time.monotonic()
        return None


def _why(exc: BaseException) -> str:
    """A refusal's reason: BadReport's own line, else what kind of fault it was."""
    return str(exc) if isinstance(exc, BadReport) else f"its objects could not be read ({type(exc).__name__})"
