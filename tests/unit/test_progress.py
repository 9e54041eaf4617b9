"""Event handling of the per-node progress, with events shaped as ansible-runner emits them."""

from __future__ import annotations

import io

from rich.console import Console

from gpuprov.ansible.progress import PlaybookProgress


def _ev(event: str, host: str | None = None, **data) -> dict:
    body = {"event": event, "event_data": {**data}}
    if host:
        body["event_data"]["host"] = host
    return body


def test_counts_changes_failures_and_final_stats() -> None:
    out = io.StringIO()
    progress = PlaybookProgress(["a", "b"], "provision x", console=Console(file=out, width=200))
    with progress:
        for e in [
            _ev("runner_on_start", "a", task="Install", role="gpu_preflight"),
            _ev("runner_on_ok", "a", task="Install", role="gpu_preflight", res={"changed": True}),
            _ev("runner_on_start", "b", task="Install", role="gpu_preflight"),
            _ev("runner_on_failed", "b", task="Install", role="gpu_preflight",
                res={"msg": "no headers for 6.1.0-9"}),
            _ev("runner_on_failed", "a", task="Probe", ignore_errors=True, res={"msg": "x"}),
            _ev("playbook_on_stats", changed={"a": 1}, ok={"a": 5, "b": 1}, failures={"b": 1},
                dark={}),
        ]:
            progress.handle(e)
    assert progress.summary() == {
        "a": {"ok": 5, "changed": 1, "failed": 0, "unreachable": 0, "tasks": 2},
        "b": {"ok": 1, "changed": 0, "failed": 1, "unreachable": 0, "tasks": 1},
    }
    assert progress.errors() == {"b": "gpu_preflight : Install: no headers for 6.1.0-9"}
    text = out.getvalue()
    assert "a: changed  gpu_preflight : Install" in text
    assert "b: FAILED   gpu_preflight : Install: no headers for 6.1.0-9" in text


def test_unreachable_host_is_counted_without_stats() -> None:
    progress = PlaybookProgress(["a"], "t", console=Console(file=io.StringIO()))
    with progress:
        progress.handle(_ev("runner_on_unreachable", "a", task="Gathering Facts",
                            res={"msg": "ssh: connect to host 10.0.0.1 port 22: timed out"}))
    assert progress.summary()["a"]["unreachable"] == 1
    assert "timed out" in progress.errors()["a"]


def test_fact_gathering_alone_is_no_task() -> None:
    """`--tags never` still gathers facts: that must not count as a run that did something."""
    progress = PlaybookProgress(["a"], "t", console=Console(file=io.StringIO()))
    with progress:
        progress.handle(_ev("runner_on_ok", "a", task="Gathering Facts", task_action="gather_facts",
                            res={}))
        progress.handle(_ev("playbook_on_stats", ok={"a": 1}, changed={}, failures={}, dark={}))
    assert progress.summary()["a"] == {"ok": 1, "changed": 0, "failed": 0, "unreachable": 0, "tasks": 0}


def test_exec_output_keeps_a_line_whole_across_chunks_and_flushes() -> None:
    """invoke flushes the stream after every chunk it reads; a line that arrives in three
    chunks is still one prefixed line (found on emulated EC2 nodes: `cat: ` / path /
    `: Permission denied` came out as three lines)."""
    import io

    from gpuprov.core.remote import PrefixedStream

    target = io.StringIO()
    stream = PrefixedStream("node-1 ! ", target)
    for chunk in ("cat: ", "/etc/x", ": Permission denied\nlast"):
        stream.write(chunk)
        stream.flush()
    assert target.getvalue() == "node-1 ! cat: /etc/x: Permission denied\n"
    stream.end()
    assert target.getvalue().splitlines() == ["node-1 ! cat: /etc/x: Permission denied", "node-1 ! last"]


def test_exec_output_reaches_the_terminal_as_text() -> None:
    """`gpuprov exec` prints what the node's command printed: an escape sequence a node sends
    (a screen clear, OSC 52 writing the operator's clipboard) becomes '?', tabs stay, a CRLF's
    CR goes."""
    import io

    from gpuprov.core.remote import PrefixedStream

    target = io.StringIO()
    stream = PrefixedStream("node-1 | ", target)
    stream.write("ok\tcol\r\n\x1b[2Jcleared\n\x1b]52;c;cHduZWQ=\x07tail")
    stream.end()
    assert target.getvalue().splitlines() == ["node-1 | ok\tcol", "node-1 | ?[2Jcleared",
                                              "node-1 | ?]52;c;cHduZWQ=?tail"]


def test_a_warning_reads_as_an_error_does(capsys) -> None:
    """Issue 53, section 7: every warning a command says starts `gpuprov:` on a line of its own,
    as errors do (an indented plan note too); other lines are as they came."""
    from gpuprov.console import Console

    console = Console()
    console.say("  warning: could not read the vCPU quota 'x' (AccessDenied): y; going on")
    console.say("warning: spot prices not read (Throttling)")
    console.say("  plan: 4 x p4d.24xlarge")
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpuprov: warning: could not read the vCPU quota 'x' (AccessDenied): y; going on",
                   "gpuprov: warning: spot prices not read (Throttling)", "  plan: 4 x p4d.24xlarge"]


def test_piped_output_says_each_role_once_and_each_change_with_its_time(monkeypatch) -> None:
    """Issue 53: a role that every play includes again (gpuprov_base) is said once per node, not
    before each role that follows it; a change says when it happened in the run."""
    from gpuprov.ansible import progress as module

    clock = iter([100.0, 165.0, 227.0])
    monkeypatch.setattr(module.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    progress = PlaybookProgress(["a"], "provision x", console=Console(file=out, width=200))
    with progress:
        for role, task, changed in [("gpuprov_base", "Facts", False), ("gpu_preflight", "Check", True),
                                    ("gpuprov_base", "Facts", False), ("nvidia_driver", "Install", True)]:
            progress.handle(_ev("runner_on_start", "a", task=task, role=role))
            progress.handle(_ev("runner_on_ok", "a", task=task, role=role, res={"changed": changed}))
    lines = out.getvalue().splitlines()
    assert lines == ["provision x: 1 node(s)", "  a: gpuprov_base", "  a: gpu_preflight",
                     "  a: changed  gpu_preflight : Check [1:05]", "  a: nvidia_driver",
                     "  a: changed  nvidia_driver : Install [2:07]"]
