"""Review 4, item 5: a pull node whose run takes longer than its deadline is not failed when it
succeeded. The final report has its own grace after the run, however long the run took; the
deadline is the bootstrap's time out (gpuprov.pull.DEADLINE_S: the fetch and the run), set in
every node's configuration, the plays and the probes stop at it (and the node says so); a
node's presigned URLs live for the deadline, the final report's grace and a slack."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprov import pull
from gpuprov.pull import Boot
from gpuprov.pull.server import PullServer
from tests.unit.node_programs import load_agent

KEY = b"k" * 32
SERVED = b"FIXTURE bundle bytes"
SHA = hashlib.sha256(SERVED).hexdigest()


def _agent():
    return load_agent("gpuprov_pull_agent_deadline")


def test_a_run_longer_than_its_deadline_still_sends_its_final_report(tmp_path: Path, monkeypatch) -> None:
    agent = _agent()
    monkeypatch.setattr(agent, "STATE", tmp_path / "state")
    offset = [0.0]
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0],
                                                       sleep=time.sleep))

    def converge(*args: Any) -> int:
        offset[0] += 2 * 3600  # the plays took two hours, past the node's deadline of one
        return 0

    monkeypatch.setattr(agent, "unpack", lambda data, root: (root.mkdir(parents=True), {"format": 1})[1])
    monkeypatch.setattr(agent, "inventory", lambda root, config: root / "inventory.yml")
    monkeypatch.setattr(agent, "environment", lambda *args: {})
    monkeypatch.setattr(agent, "converge", converge)
    monkeypatch.setattr(agent, "write_manifest", lambda *args: {"digest": "a" * 64, "items": 3})
    monkeypatch.setattr(agent, "probes", lambda *args: [{"probe": "gpu_answers", "status": "pass", "detail": ""}])
    with PullServer("127.0.0.1", KEY, SERVED, SHA, ["n1"]) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{SHA}", report_url=f"{server.base_url}/report",
                    sha256=SHA, key=KEY, deadline_s=3600)
        config = tmp_path / "pull.json"
        # No background sends: what reaches the controller is the final report's.
        config.write_text(json.dumps({**boot.node_config("n1", "docker-node"), "report_every_s": 3600}))
        assert agent.main(str(config)) == 0
        kinds = [e["event"] for e in server.events["n1"]]
        done = server.events["n1"][-1]["event_data"]
    assert kinds[-2:] == ["probes", "done"] and done["rc"] == 0 and done["manifest"]["items"] == 3


def test_plays_past_the_budget_are_stopped_with_their_children_and_said(tmp_path: Path) -> None:
    agent = _agent()
    began = time.monotonic()
    child = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
             "time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)")
    out = tmp_path / "out"
    with out.open("w") as stdout, pytest.raises(TimeoutError, match="the plays passed the run's time budget"):
        agent.within([sys.executable, "-c", child], time.monotonic() + 2, "the plays", stdout=stdout)
    assert time.monotonic() - began < 20
    grandchild = int(out.read_text().split()[0])
    for _ in range(100):  # the grandchild, stopped with its group (reaped by init)
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"pid {grandchild} outlived the plays' budget")
    assert agent.within([sys.executable, "-c", "raise SystemExit(3)"], time.monotonic() + 30, "the plays") == 3
    assert agent.within([sys.executable, "-c", "pass"], None, "the probes") == 0


def test_a_plays_timeout_is_reported_as_the_nodes_failure(tmp_path: Path, monkeypatch) -> None:
    agent = _agent()
    monkeypatch.setattr(agent, "STATE", tmp_path / "state")

    def converge(*args: Any) -> int:
        raise TimeoutError("the plays passed the run's time budget (deadline_s) and were stopped")

    monkeypatch.setattr(agent, "unpack", lambda data, root: (root.mkdir(parents=True), {"format": 1})[1])
    monkeypatch.setattr(agent, "inventory", lambda root, config: root / "inventory.yml")
    monkeypatch.setattr(agent, "environment", lambda *args: {})
    monkeypatch.setattr(agent, "converge", converge)
    with PullServer("127.0.0.1", KEY, SERVED, SHA, ["n1"]) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{SHA}", report_url=f"{server.base_url}/report",
                    sha256=SHA, key=KEY)
        config = tmp_path / "pull.json"
        config.write_text(json.dumps(boot.node_config("n1", "docker-node")))
        assert agent.main(str(config)) == 1
        events = server.events["n1"]
    failed = [e["event_data"]["msg"] for e in events if e["event"] == "agent_failed"]
    assert failed == ["TimeoutError: the plays passed the run's time budget (deadline_s) and were stopped"]
    assert events[-1]["event"] == "done" and events[-1]["event_data"]["rc"] == 1


class _Channel:
    def __init__(self) -> None:
        self.expires: list[int] = []

    def node_urls(self, node: str, sha256: str, expires_s: int) -> dict[str, Any]:
        self.expires.append(expires_s)
        return {"channel": "s3", "bundle_url": "https://b/x", "report_url": "https://b/", "report_fields": {},
                "report_prefix": f"p/{node}/"}


def test_the_deadline_is_the_bootstraps_budget_and_the_urls_outlive_it_and_the_final_report() -> None:
    channel = _Channel()
    boot = Boot(bundle_url="", report_url="", sha256=SHA, key=KEY, channel=channel)
    config = boot.node_config("n1", "")
    assert config["deadline_s"] == pull.DEADLINE_S == pull.FETCH_S + pull.RUN_S
    assert pull.RUN_S > 3600 and config["report_grace_s"] == pull.REPORT_GRACE_S
    (expires,) = channel.expires
    assert expires == pull.DEADLINE_S + pull.REPORT_GRACE_S + pull.URL_SLACK_S
    plain = Boot(bundle_url="http://x/b", report_url="http://x/r", sha256=SHA, key=KEY).node_config("n1", "")
    assert plain["deadline_s"] == pull.DEADLINE_S and plain["report_grace_s"] == pull.REPORT_GRACE_S
