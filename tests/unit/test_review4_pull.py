"""Review 4, items 2 and 3: one node's faults stay its own, and one node cannot make the
controller read without bound. A report whose event name is a list or an object, a body that
makes the JSON reader itself fail (nesting past its recursion limit), an object the store
cannot read: each fails that one node with its reason, through every entry point that takes a
node's bytes (check_report, PullServer.take, ObjectReports.poll and _take), and the other
nodes go on. ObjectReports.poll checks names and sizes from the listing before any GET, reads
in sequence order up to the first refusal, at most MAX_PER_POLL objects per node per listing,
and never reads again a batch already taken or one older than it. The store here is a plain
in-memory stand-in for the provider's channel (gpuprov.providers.aws.s3.Channel's four calls)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuprov.pull import report_secret, report_signature
from gpuprov.pull.objects import MAX_PER_POLL, ObjectReports
from gpuprov.pull.reports import MAX_REPORT, BadReport, check_report
from gpuprov.pull.server import PullServer

KEY = b"k" * 32
GOOD = {"event": "agent", "event_data": {"msg": "started"}}


class Store:
    """The channel's four calls over a dict of objects; what was read, in order."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.sizes: dict[str, int] = {}  # a size the listing says, over the object's own
        self.reads: list[str] = []
        self.broken: set[str] = set()

    def report_prefix(self, node: str) -> str:
        return f"gpuprov/run/reports/{node}/"

    def list_reports(self) -> dict[str, int]:
        return {k: self.sizes.get(k, len(v)) for k, v in self.objects.items()}

    def read_object(self, key: str) -> bytes:
        self.reads.append(key)
        if key in self.broken:
            raise ConnectionResetError("the store dropped the connection")
        return self.objects[key]

    def delete_keys(self, keys: list[str]) -> None:
        for key in keys:
            self.objects.pop(key, None)

    def put(self, node: str, seq: int, events: list[Any], start: int = 0, *, body: bytes | None = None,
            sign: bool = True) -> str:
        body = body if body is not None else json.dumps({"from": start, "events": events}).encode()
        sig = report_signature(report_secret(KEY, node), seq, body) if sign else "0" * 64
        key = f"{self.report_prefix(node)}{seq:08d}-{sig}.json"
        self.objects[key] = body
        return key


def _nested(depth: int = 100_000) -> bytes:
    return b'{"from": 0, "events": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("kind", [["agent"], {"a": 1}, 7, None, True])
def test_an_event_name_of_another_type_is_a_bad_report_not_a_type_error(kind: Any) -> None:
    body = json.dumps({"from": 0, "events": [{"event": kind, "event_data": {}}]}).encode()
    with pytest.raises(BadReport, match="event 0: unknown event"):
        check_report(body)


def test_a_body_that_breaks_the_json_reader_is_a_bad_report() -> None:
    with pytest.raises(BadReport, match=r"could not be read \(RecursionError\)"):
        check_report(_nested())


def test_the_server_fails_only_the_node_whose_report_raises_anything() -> None:
    server = PullServer("127.0.0.1", KEY, b"", "ab" * 32, ["n1", "n2"])
    try:
        def boom() -> tuple[int, list[dict[str, Any]]]:
            raise TypeError("unhashable type: 'list'")

        status, answer = server.take("n1", 1, boom)
        assert status == 400 and "could not be read (TypeError)" in answer["error"]
        assert "n1" in server.failed and server.events["n1"] == []
        body = json.dumps({"from": 0, "events": [{"event": ["x"], "event_data": {}}]}).encode()
        assert server.take("n2", 1, lambda: check_report(_nested()))[0] == 400
        assert set(server.failed) == {"n1", "n2"}
        server.add_nodes(["n3"])
        assert server.take("n3", 1, lambda: check_report(body))[0] == 400
        assert "unknown event" in server.failed["n3"]
        server.add_nodes(["n4"])
        good = json.dumps({"from": 0, "events": [GOOD]}).encode()
        assert server.take("n4", 1, lambda: check_report(good)) == (200, {"have": 1})
    finally:
        server.httpd.server_close()


def test_one_nodes_bad_objects_fail_that_node_and_the_poll_goes_on() -> None:
    store = Store()
    store.put("n1", 1, [{"event": ["agent"], "event_data": {}}])  # the review's TypeError
    store.put("n2", 1, [], body=_nested())  # the JSON reader's own RecursionError
    store.broken.add(store.put("n3", 1, [GOOD]))  # the store cannot hand it over
    store.put("n4", 1, [GOOD])
    reports = ObjectReports(store, KEY, ["n1", "n2", "n3", "n4"], poll_s=0)
    reports.poll()
    assert set(reports.failed) == {"n1", "n2", "n3"}
    assert "unknown event" in reports.failed["n1"]
    assert "ConnectionResetError" in reports.failed["n3"]
    assert [e["event"] for e in reports.events["n4"]] == ["agent"]


@pytest.mark.parametrize("name", ["notes.txt", "00000001-zz.json", "1-" + "a" * 64 + ".json",
                                  "00000001-" + "a" * 64 + ".json.bak"])
def test_a_badly_named_object_fails_its_node_before_anything_is_read(name: str) -> None:
    store = Store()
    store.put("n1", 1, [GOOD])
    store.objects[store.report_prefix("n1") + name] = b"{}"
    good = store.put("n2", 1, [GOOD])
    reports = ObjectReports(store, KEY, ["n1", "n2"], poll_s=0)
    reports.poll()
    assert "not a report batch" in reports.failed["n1"]
    assert store.reads == [good]  # nothing of n1's read
    assert reports.events["n1"] == []


def test_an_object_listed_too_big_fails_its_node_unread() -> None:
    store = Store()
    big = store.put("n1", 2, [GOOD])
    store.put("n1", 1, [GOOD])
    store.sizes[big] = MAX_REPORT + 1
    reports = ObjectReports(store, KEY, ["n1"], poll_s=0)
    reports.poll()
    assert "bytes (at most" in reports.failed["n1"]
    assert store.reads == []


def test_batches_are_taken_in_sequence_order_and_reading_stops_at_the_first_refusal() -> None:
    store = Store()
    store.put("n1", 3, [GOOD], start=2)  # good, but after the refusal: never taken
    store.put("n1", 2, [GOOD], start=1, sign=False)  # refused
    store.put("n1", 1, [GOOD])
    reports = ObjectReports(store, KEY, ["n1"], poll_s=0)
    reports.poll()
    assert "batch 2 is not signed" in reports.failed["n1"]
    assert len(reports.events["n1"]) == 1


def test_a_node_is_read_at_most_max_per_poll_objects_a_listing_and_never_twice() -> None:
    store = Store()
    count = MAX_PER_POLL * 2 + 3
    for seq in range(count, 0, -1):
        store.put("n1", seq, [GOOD], start=seq - 1)
    reports = ObjectReports(store, KEY, ["n1"], poll_s=0)
    reports.poll()
    assert len(store.reads) == MAX_PER_POLL
    assert sorted(store.reads) == sorted(store.reads)[:MAX_PER_POLL]
    assert len(reports.events["n1"]) == MAX_PER_POLL
    polls = 1
    while len(reports.events["n1"]) < count:
        reports.poll()
        polls += 1
    assert polls == 3 and len(store.reads) == count == len(set(store.reads))
    assert not reports.failed and store.objects == {}
    reports.poll()
    assert len(store.reads) == count


def test_a_batch_older_than_one_taken_is_removed_unread() -> None:
    store = Store()
    store.put("n1", 5, [GOOD])
    reports = ObjectReports(store, KEY, ["n1"], poll_s=0)
    reports.poll()
    late = [store.put("n1", seq, [GOOD]) for seq in (3, 5)]  # written again, or listed late
    reports.poll()
    assert store.reads == [store.reads[0]] and all(k not in store.objects for k in late)
    assert not reports.failed and len(reports.events["n1"]) == 1
