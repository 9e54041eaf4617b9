"""Review 4, item 7: text from nodes reaches the terminal without its escape sequences. ``ESC ]
52`` (writes the operator's clipboard), ``ESC [2J`` (clears the screen), C1 controls, DEL, a
bidi override and the line separators each become ``?`` where the node's text is first read
(gpuprov.node_text, one helper): a pull agent's report, Ansible's events (task names, results),
Slurm's reasons for `status` and `patch`, ssh's stderr, the health script's output and the
manifest program's answer."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from gpuprov import ssh
from gpuprov.ansible.progress import PlaybookProgress, unreachable_reason
from gpuprov.health import gather
from gpuprov.manifest import remote
from gpuprov.node_text import printable, printable_data
from gpuprov.pull.reports import check_report
from gpuprov.slurm import scheduler
from gpuprov.slurm.drain import SlurmDrains
from gpuprov.state import NodeRecord

CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"
CLEAR = "\x1b[2J\x1b[H"
HOSTILE = [CLIPBOARD, CLEAR, "\x9b31m", "\x7f", "\u202e", "\u2028", "\u2029", "\x00", "\x08", "\r", "\x0c"]
NODE = NodeRecord(name="n1", id="i-1", address="10.0.0.1", ssh_port=22, user="u", state="running", zone="static")


def _clean(text: str) -> bool:
    return all(c.isprintable() or c in "\n\t" for c in text) and "\x1b" not in text


@pytest.mark.parametrize("bad", HOSTILE)
def test_every_character_a_terminal_acts_on_becomes_a_question_mark(bad: str) -> None:
    said = printable(f"ok {bad} done")
    assert _clean(said) and "\n" not in said and said.startswith("ok ") and said.endswith(" done")
    assert "?" in said
    assert printable("a\nb\tc", lines=True) == "a\nb\tc" and printable("a\r\nb", lines=True) == "a\nb"
    assert printable("a\nb") == "a?b"
    assert printable_data({f"k{bad}": [f"v{bad}", 1, None, True]}) == {
        printable(f"k{bad}", lines=True): [printable(f"v{bad}", lines=True), 1, None, True]}


def test_a_text_that_is_printable_is_left_as_it_is() -> None:
    for text in ("cannot stat [/dev/nvidia0]", "H100 80GB HBM3 é ü 中", ""):
        assert printable(text) == text


def test_a_pull_report_reaches_the_controller_without_escapes() -> None:
    events = [{"event": "agent", "event_data": {"host": "n1", "msg": f"fetched {CLIPBOARD} the bundle"}},
              {"event": "runner_on_failed", "event_data": {"host": "n1", "task": f"Install {CLEAR}", "role": "r",
                                                           "res": {"msg": f"E: {CLEAR}broken"}}},
              {"event": "agent_failed", "event_data": {"host": "n1", "msg": "no\u202eway"}},
              {"event": "probes", "event_data": {"rows": [{"probe": f"p{CLEAR}", "status": "fail",
                                                           "detail": f"found {CLIPBOARD}"}]}},
              {"event": "playbook_on_stats", "event_data": {"ok": {f"n1{CLEAR}": 1}}},
              {"event": "runner_on_ok", "event_data": {"task": "t", "res": {"report": {f"k{CLEAR}": f"v{CLEAR}",
                                                                                      "l": [CLIPBOARD]}}}}]
    _, checked = check_report(json.dumps({"from": 0, "events": events}).encode())
    text = json.dumps(checked, ensure_ascii=False)
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert checked[0]["event_data"]["msg"] == "fetched ?]52;c;cm0gLXJmIH4K? the bundle"


def test_task_names_and_messages_of_a_run_reach_the_terminal_without_escapes() -> None:
    out = io.StringIO()
    progress = PlaybookProgress(["a", "b"], "provision", console=Console(file=out, width=400))

    def ev(event: str, host: str, **data) -> dict:
        return {"event": event, "event_data": {"host": host, **data}}

    with progress:
        for event in (ev("runner_on_start", "a", task=f"stat {CLEAR}", role=f"gpu{CLIPBOARD}"),
                      ev("runner_on_ok", "a", task=f"stat {CLEAR}", task_action="stat", res={"changed": True}),
                      ev("runner_on_failed", "a", task=f"stat {CLEAR}", res={"msg": f"cannot {CLIPBOARD}"}),
                      ev("runner_on_unreachable", "b", task="x", res={"msg": f"ssh: refused{CLEAR}"})):
            progress.handle(event)
    assert _clean(out.getvalue()) and "cannot ?]52;c;cm0gLXJmIH4K?" in out.getvalue()
    assert all(_clean(e) for e in progress.errors().values())
    assert _clean(unreachable_reason({"msg": f"Failed to connect to the host via ssh: {CLIPBOARD}"}))


def test_slurm_reasons_reach_status_without_escapes() -> None:
    found = scheduler.parse_sinfo(f"n1|drained|bad{CLEAR}gpu\nn2{CLIPBOARD}|idle|none\n")
    assert found["n1"].reason == "bad?[2J?[Hgpu" and found["n1"].state == "drained"
    assert all(_clean(name) and _clean(n.reason) for name, n in found.items())


def test_slurm_reasons_read_by_the_roll_are_printable(monkeypatch) -> None:
    roll = SlurmDrains.__new__(SlurmDrains)
    roll.names, roll.controller = {"n1": "n1"}, NODE
    monkeypatch.setattr(SlurmDrains, "_on_controller", lambda self, *args: f"drained|mine{CLIPBOARD}\n")
    state, reason = roll.state("n1")
    assert state == "drained" and reason == "mine?]52;c;cm0gLXJmIH4K?"


def test_ssh_stderr_reaches_the_terminal_without_escapes() -> None:
    said = ssh.ssh_error_line(f"Warning: x\nkex_exchange_identification: {CLIPBOARD}{CLEAR}\n", 255)
    assert _clean(said) and said.startswith("kex_exchange_identification: ?]52")


def test_the_health_scripts_output_is_printable_before_any_check_reads_it() -> None:
    output = f"{gather.MARK} smi\nGPU 0: H100 {CLEAR}\x9b\n{gather.MARK}-rc smi 0\n{gather.MARK} dmesg\nNVRM: {CLIPBOARD}\n"
    sections = gather.split(output)
    assert set(sections) == {"smi", "dmesg"} and sections["smi"].rc == 0
    assert sections["smi"].text == "GPU 0: H100 ?[2J?[H?" and sections["dmesg"].text == "NVRM: ?]52;c;cm0gLXJmIH4K?"


def test_the_manifest_programs_answer_is_printable(monkeypatch, tmp_path: Path) -> None:
    answer = {"state": "drifted", "digest": "d" * 64, "items": 3, "drift": [f"/etc/x{CLEAR} changed"]}

    def run(*args, **kwargs):
        return SimpleNamespace(returncode=0, stdout=json.dumps(answer) + "\n", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    found = remote.ask(NODE, tmp_path / "key", tmp_path / "known_hosts", "check", {})
    assert found.data["drift"] == ["/etc/x?[2J?[H changed"]
