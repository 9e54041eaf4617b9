"""A pull node's reports are data the controller checks, never trusts: each against the real
pull server on 127.0.0.1 (real sockets, http.client), and the node agent's own Reporter
talking to it. A batch must be signed with the node's report secret (its bearer token alone
forges nothing, a replayed batch is refused), must have the shape the agent sends (a bad one
is 400 and fails that node alone), and the server bounds what a client can hold: a silent
connection is dropped, past the connection cap a client is answered 503, a node's events are
capped, a bad Content-Length is 400 unread. Then the controller's side (follow): a node whose
report is bad, that ran no task, or lacks probes is failed with its reason; the others pass."""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console as RichConsole

from gpuprov.pull import Boot, node_token, report_secret, report_signature
from gpuprov.pull.reports import MAX_BATCH, MAX_REPORT, MAX_TEXT
from gpuprov.pull.server import PullServer
from tests.unit.node_programs import load_agent

KEY = b"r" * 32
SHA = "ab" * 32


def _agent():
    return load_agent("gpuprov_pull_agent_reports")


def _post(server: PullServer, node: str, body: bytes, seq: int, *, secret: str | None = None,
          token: str | None = None, sign: bool = True) -> tuple[int, dict]:
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"X-Gpuprov-Node": node, "Authorization": f"Bearer {token or node_token(KEY, node)}",
               "Content-Type": "application/json", "X-Gpuprov-Seq": str(seq)}
    if sign:
        headers["X-Gpuprov-Signature"] = report_signature(secret or report_secret(KEY, node), seq, body)
    try:
        conn.request("POST", "/report", body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        conn.close()


def _batch(start: int, *events: dict) -> bytes:
    return json.dumps({"from": start, "events": list(events)}).encode()


def _ev(event: str, **data: Any) -> dict:
    return {"event": event, "event_data": data}


TASK = _ev("runner_on_ok", task="Install rdma-core", role="rdma", task_action="apt", res={"changed": True})


# -- signed reports ---------------------------------------------------------------------------
def test_a_captured_token_alone_cannot_forge_a_report_nor_replay_one() -> None:
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["n1"]) as server:
        body = _batch(0, TASK)
        token = node_token(KEY, "n1")
        assert _post(server, "n1", body, 1, sign=False)[0] == 403  # the token, no signature
        assert _post(server, "n1", body, 1, secret=token)[0] == 403  # signed with the token itself
        assert _post(server, "n1", body, 1, secret=report_secret(KEY, "n2"))[0] == 403  # another node's
        assert _post(server, "n1", body, 1, secret=report_secret(b"x" * 32, "n1"))[0] == 403  # another session's
        assert server.events["n1"] == []
        assert _post(server, "n1", body, 1) == (200, {"have": 1})
        # The same batch again, signature and all (captured on the wire): refused, nothing doubled.
        assert _post(server, "n1", body, 1)[0] == 409
        # A forged body under a seen batch's signature: refused.
        forged = _batch(1, _ev("done", rc=0))
        host, port = server.httpd.server_address[:2]
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", "/report", body=forged, headers={
            "X-Gpuprov-Node": "n1", "Authorization": f"Bearer {token}", "X-Gpuprov-Seq": "2",
            "X-Gpuprov-Signature": report_signature(report_secret(KEY, "n1"), 1, body)})
        assert conn.getresponse().status == 403
        conn.close()
        assert [e["event"] for e in server.events["n1"]] == ["runner_on_ok"]
        assert server.failed == {} and server.refused == 6
    # The secret is derived like the token, and is not it.
    assert report_secret(KEY, "n1") != node_token(KEY, "n1")
    assert Boot(bundle_url="", report_url="", sha256=SHA, key=KEY).node_config("n1", "")["report_secret"] == \
        report_secret(KEY, "n1")


# -- the shape of a report --------------------------------------------------------------------
ROW = {"probe": "os_supported", "status": "pass", "detail": "Debian 12"}
BAD = {
    "top-level ok": json.dumps({"ok": "x"}).encode(),
    "stats ok a string": _batch(0, _ev("playbook_on_stats", ok="x")),
    "probe status bogus": _batch(0, _ev("probes", rows=[{**ROW, "status": "bogus"}])),
    "probe row without detail": _batch(0, _ev("probes", rows=[{"probe": "os_supported", "status": "pass"}])),
    "task event without its task": _batch(0, _ev("runner_on_ok", res={"changed": True})),
    "done without rc": _batch(0, _ev("done")),
    "unknown event": _batch(0, _ev("runner_on_whatever", task="t")),
    "event not an object": _batch(0, "runner_on_ok"),
    "res a list": _batch(0, _ev("runner_on_failed", task="t", res=["x"])),
    "changed a string": _batch(0, _ev("runner_on_ok", task="t", res={"changed": "yes"})),
    "from negative": _batch(-1, TASK),
    "from a bool": json.dumps({"from": True, "events": []}).encode(),
    "not JSON": b"{not json",
    "not UTF-8": b"\xff\xfe{}",
    "a message too long": _batch(0, _ev("agent_failed", msg="m" * (MAX_TEXT + 1))),
    "too many events": _batch(0, *[TASK] * (MAX_BATCH + 1)),
    # The manifest the agent reports with its outcome: a sha256 and a count, or why none.
    "manifest digest not hex": _batch(0, _ev("done", rc=0, manifest={"digest": "z" * 64, "items": 3})),
    "manifest items negative": _batch(0, _ev("done", rc=0, manifest={"digest": "a" * 64, "items": -1})),
    "manifest with its items": _batch(0, _ev("done", rc=0, manifest={"digest": "a" * 64, "items": 1,
                                                                    "list": ["/etc/x"]})),
    "manifest error too long": _batch(0, _ev("done", rc=0, manifest={"error": "e" * (MAX_TEXT + 1)})),
}


@pytest.mark.parametrize("why", sorted(BAD))
def test_a_report_not_of_the_agents_shape_is_400_and_fails_that_node_alone(why: str) -> None:
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["bad", "good"]) as server:
        assert _post(server, "bad", _batch(0, TASK), 1) == (200, {"have": 1})
        status, answer = _post(server, "bad", BAD[why], 2)
        assert status == 400 and answer["error"], answer
        assert server.failed["bad"].startswith("its report was refused: ") and answer["error"] in server.failed["bad"]
        assert len(server.failed["bad"]) < 300 and "\n" not in server.failed["bad"]  # one line
        # Nothing of it was kept, and nothing more from that node is.
        assert [e["event"] for e in server.events["bad"]] == ["runner_on_ok"]
        assert _post(server, "bad", _batch(1, _ev("done", rc=0)), 3)[0] == 400
        # The other node goes on.
        assert _post(server, "good", _batch(0, TASK, _ev("probes", rows=[ROW])), 1) == (200, {"have": 2})
        assert list(server.failed) == ["bad"]


def test_a_real_probe_row_and_every_event_the_agent_sends_are_taken() -> None:
    events = [
        _ev("agent", host="x", msg="started"),
        _ev("runner_on_start", host="x", task="t", role="r", task_action="apt"),
        _ev("runner_on_failed", host="x", task="t", role="r", task_action="apt", res={"msg": "m"},
            ignore_errors=True),
        _ev("runner_on_skipped", host="x", task="t", role="", task_action="apt", res={}),
        _ev("runner_on_unreachable", host="x", task="t", role="", task_action="apt", res={"msg": "m"}),
        _ev("playbook_on_stats", ok={"x": 3}, changed={"x": 1}, failures={}, dark={}, skipped={"x": 0}),
        _ev("probes", host="x", rows=[{**ROW, "host": "local"}, {**ROW, "status": "fail"},
                                      {**ROW, "status": "skip"}]),
        _ev("refused", host="x", msg="bundle sha256 ..."),
        _ev("done", host="x", rc=0, converge_s=12.5, probes_s=3, manifest={"digest": "0f" * 32, "items": 103}),
        _ev("done", host="x", rc=0, manifest={"error": "the manifest program failed: ..."}),
    ]
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["n1"]) as server:
        assert _post(server, "n1", _batch(0, *events), 1) == (200, {"have": len(events)})
        assert server.failed == {}
        assert {e["event_data"].get("host") for e in server.events["n1"]} == {"n1"}  # as itself


# -- what a client can hold ---------------------------------------------------------------------
def _raw(server: PullServer, head: bytes) -> bytes:
    """``head`` as sent (no body), the server's whole answer."""
    with socket.create_connection(server.httpd.server_address[:2], timeout=10) as sock:
        sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_missing_bad_negative_or_oversized_content_length_is_400_unread() -> None:
    # Today's main answered a missing, zero, negative or oversized one 400 already; one that is
    # not a number ("abc", "1e3", blank, repeated) crashed the handler and left no answer.
    lengths = [None, "abc", "-5", "0", "1e3", " ", str(MAX_REPORT + 1), "9" * 30, "12, 12", "+12", "0x10"]
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["n1"]) as server:
        for length in lengths:
            head = (f"POST /report HTTP/1.1\r\nHost: x\r\nX-Gpuprov-Node: n1\r\n"
                    f"Authorization: Bearer {node_token(KEY, 'n1')}\r\n"
                    + (f"Content-Length: {length}\r\n" if length is not None else "") + "\r\n").encode()
            answer = _raw(server, head)  # nothing follows the headers: an answer proves it read none
            assert answer.startswith(b"HTTP/1.0 400 ") and b"Content-Length of 1 to" in answer, (length, answer[:200])
        # None counted against the node (the body is unread, unsigned), and the server serves on.
        assert server.failed == {} and server.refused == len(lengths)
        assert _post(server, "n1", _batch(0, TASK), 1) == (200, {"have": 1})


def test_a_silent_connection_is_dropped_and_the_server_serves_others_meanwhile() -> None:
    with PullServer("127.0.0.1", KEY, b"BUNDLE", SHA, ["n1"], timeout_s=1.0) as server:
        silent = socket.create_connection(server.httpd.server_address[:2], timeout=20)
        try:
            silent.sendall(b"GET /bundle/")  # and then nothing more
            host, port = server.httpd.server_address[:2]
            conn = http.client.HTTPConnection(host, port, timeout=10)
            conn.request("GET", f"/bundle/{SHA}", headers={"X-Gpuprov-Node": "n1",
                                                           "Authorization": f"Bearer {node_token(KEY, 'n1')}"})
            answer = conn.getresponse()
            assert (answer.status, answer.read()) == (200, b"BUNDLE")
            conn.close()
            # The server closes the silent one (well before this socket's own 20 s timeout).
            assert silent.recv(1024) == b""
        finally:
            silent.close()


def test_a_connection_that_trickles_is_closed_at_its_deadline() -> None:
    # One byte every 0.3 s, well inside the 1 s per-read timeout: only the deadline ends it.
    with PullServer("127.0.0.1", KEY, b"BUNDLE", SHA, ["n1"], timeout_s=1.0, deadline_s=2.0) as server:
        with socket.create_connection(server.httpd.server_address[:2], timeout=20) as slow:
            started = time.monotonic()
            closed = False
            for byte in b"POST /report HTTP/1.0\r\nX-Gpuprov-Node: n1\r\nX-Padding: " + b"a" * 200:
                try:
                    slow.sendall(bytes([byte]))
                    slow.settimeout(0.3)
                    if slow.recv(1024) == b"":
                        closed = True
                        break
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
                    break
            assert closed, "the server kept a trickling connection past its deadline"
            assert time.monotonic() - started < 20


def test_past_the_connection_cap_a_client_is_answered_503_and_served_once_one_leaves() -> None:
    with PullServer("127.0.0.1", KEY, b"BUNDLE", SHA, ["n1"], max_connections=2, timeout_s=60) as server:
        held = [socket.create_connection(server.httpd.server_address[:2], timeout=10) for _ in range(2)]
        try:
            # Connections are accepted in order: these two hold both slots, the third is turned away.
            answer = _raw(server, b"")
            assert answer.startswith(b"HTTP/1.0 503 ") and b"Retry-After: 2" in answer, answer
            assert server.turned_away == 1
        finally:
            for sock in held:
                sock.close()
        # Once they left, a node is served again (their threads end as they read the close).
        for _ in range(50):
            with socket.create_connection(server.httpd.server_address[:2], timeout=10) as sock:
                sock.sendall(f"GET /bundle/{SHA} HTTP/1.0\r\nX-Gpuprov-Node: n1\r\n"
                             f"Authorization: Bearer {node_token(KEY, 'n1')}\r\n\r\n".encode())
                got = b"".join(iter(lambda s=sock: s.recv(65536), b""))
            if not got.startswith(b"HTTP/1.0 503"):
                break
            time.sleep(0.1)
        assert got.startswith(b"HTTP/1.0 200 ") and got.endswith(b"BUNDLE"), got


def test_events_past_the_per_node_cap_fail_that_node_and_keep_what_it_had() -> None:
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["n1", "n2"], max_events=3) as server:
        assert _post(server, "n1", _batch(0, TASK, TASK), 1) == (200, {"have": 2})
        # Resent from 0 (a lost answer): the two it has do not count again.
        assert _post(server, "n1", _batch(0, TASK, TASK, TASK), 2) == (200, {"have": 3})
        status, answer = _post(server, "n1", _batch(3, TASK), 3)
        assert status == 400 and "more than 3 events from one node" in answer["error"]
        assert len(server.events["n1"]) == 3 and "more than 3 events" in server.failed["n1"]
        assert _post(server, "n2", _batch(0, TASK), 1) == (200, {"have": 1})


# -- the agent's Reporter against the real server --------------------------------------------------
def _reporter(agent, server: PullServer, node: str, tmp_path: Path, **override: Any):
    boot = Boot(bundle_url=f"{server.base_url}/bundle/{SHA}", report_url=f"{server.base_url}/report", sha256=SHA,
                key=KEY)
    config = {**boot.node_config(node, ""), **override}
    return agent.Reporter(config, tmp_path / f"events-{node}.jsonl")


def test_the_agents_reporter_signs_each_batch_and_the_server_takes_them_once(tmp_path: Path) -> None:
    agent = _agent()
    with PullServer("127.0.0.1", KEY, b"B", SHA, ["n1", "n2"]) as server:
        reporter = _reporter(agent, server, "n1", tmp_path)
        for number in range(MAX_BATCH + 20):  # more than a batch: two sends
            reporter.add("runner_on_start", task=f"task {number}", role="r", task_action="apt")
        reporter.add("agent_failed", msg="x" * (3 * MAX_TEXT))  # cut to what the server takes
        reporter.add("probes", rows=[{**ROW, "host": "local", "detail": "d" * (2 * MAX_TEXT)}])
        reporter.add("done", rc=0)
        assert reporter.send() is False and reporter.send() is True  # two batches, each acknowledged
        assert reporter.send() is True  # nothing new: an empty batch, a fresh sequence number
        kept = server.events["n1"]
        assert len(kept) == MAX_BATCH + 23 and server.failed == {} and server.seq["n1"] == 3
        assert len(kept[-3]["event_data"]["msg"]) == MAX_TEXT and kept[-1]["event"] == "done"
        # The agent started again (a reboot mid-run) numbers its batches on from the last one sent.
        again = _reporter(agent, server, "n1", tmp_path)
        assert again.seq == 3 and again.send() is True and server.seq["n1"] == 4 and len(kept) == MAX_BATCH + 23
        # A line the plays' callback (another process) is still writing waits for the next send.
        with again.events.open("a") as out:
            out.write('{"event": "runner_on_start", "event_data": {"host": "n1", "ta')
        assert again.send() is True and len(kept) == MAX_BATCH + 23
        with again.events.open("a") as out:
            out.write('sk": "t", "role": "r", "task_action": "apt"}}\n')
        assert again.send() is True and len(kept) == MAX_BATCH + 24 and kept[-1]["event_data"]["task"] == "t"
        # A node with its token but not its report secret sends nothing that is kept.
        forger = _reporter(agent, server, "n2", tmp_path, report_secret=node_token(KEY, "n2"))
        forger.add("done", rc=0)
        assert forger.send() is False and server.events["n2"] == [] and "n2" not in server.failed
        # A report the server refuses as malformed: the agent stops sending, the node is failed.
        (tmp_path / "again").mkdir()
        bad = _reporter(agent, server, "n2", tmp_path / "again")
        bad.add("probes", rows=[{**ROW, "status": "bogus"}])
        assert bad.send() is True and "probe status" in bad.refused
        assert "probe status \"bogus\"" in server.failed["n2"]


# -- the controller's side ---------------------------------------------------------------------------
def _good(node_rows: list[dict]) -> list[tuple[str, dict]]:
    return [("runner_on_start", {"task": "Install", "role": "rdma", "task_action": "apt"}),
            ("runner_on_ok", {"task": "Install", "role": "rdma", "task_action": "apt", "res": {"changed": True}}),
            ("probes", {"rows": node_rows}), ("done", {"rc": 0})]


def test_follow_fails_a_bad_report_no_task_or_missing_probes_each_on_its_node_alone(tmp_path: Path) -> None:
    from gpuprov.console import Console
    from gpuprov.pull.bundle import Bundle
    from gpuprov.pull.controller import expected_probes, follow
    from gpuprov.state import NodeRecord, Store

    agent = _agent()
    every = [{"probe": p, "status": "pass", "detail": "ok"} for p in sorted(expected_probes())]
    assert len(every) > 20  # read from the probes this gpuprov carries
    reports = {
        "good": _good(every),
        "bad-stats": [*_good(every)[:2], ("playbook_on_stats", {"ok": "x"}), *_good(every)[2:]],
        "no-task": [("runner_on_ok", {"task": "Gathering Facts", "task_action": "gather_facts", "res": {}}),
                    *_good(every)[2:]],
        "few-probes": _good(every[:-3]),
        "markup": [("runner_on_start", {"task": "stat [bold]", "role": "gpu_preflight"}),
                   ("runner_on_failed", {"task": "stat [bold]", "role": "gpu_preflight",
                                         "res": {"msg": "cannot stat [/dev/nvidia0]: [/] :warning:"}}),
                   ("done", {"rc": 2})],
    }
    store = Store(tmp_path / "state.db")
    store.create_cluster("c", "docker", {})
    out = io.StringIO()
    console = Console()
    console.rich = RichConsole(file=out, width=300, highlight=False)
    data = b"bundle"
    import hashlib

    bundle = Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), manifest={"format": 1})
    with PullServer("127.0.0.1", KEY, data, bundle.sha256, []) as server:
        for node, events in reports.items():
            (tmp_path / node).mkdir()
            reporter = _reporter(agent, server, node, tmp_path / node)
            for kind, fields in events:
                reporter.add(kind, **fields)
            assert reporter.send() is True
        nodes = [NodeRecord(name=n, id=n, address="", ssh_port=0, user="", state="running") for n in reports]
        (tmp_path / "run").mkdir()
        result, report = follow(store, "c", server, bundle, nodes, tmp_path / "run", console=console, tags=[])
    assert sorted(result.errors) == ["bad-stats", "few-probes", "markup", "no-task"] and not result.ok
    assert result.errors["bad-stats"].startswith("its report was refused: event 2: ok: an object of node: count")
    assert result.errors["no-task"] == "no task ran on this node"
    assert result.errors["few-probes"].startswith(f"its report lacks 3 of the {len(every)} probes it must run: ")
    assert result.errors["markup"] == "gpu_preflight : stat [bold]: cannot stat [/dev/nvidia0]: [/] :warning:"
    text = out.getvalue()
    assert "markup: FAILED gpu_preflight : stat [bold]: cannot stat [/dev/nvidia0]: [/] :warning:" in text
    assert report.verify is None  # nothing verified while a node failed
    assert store.get_cluster("c").failed_step == "bootstrap"
