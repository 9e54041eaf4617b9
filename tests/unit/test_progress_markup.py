"""What a node says reaches the terminal as text: a task failing with ``cannot stat
[/dev/nvidia0]`` (rich would read it as a closing tag and raise MarkupError, aborting the run
for every node), ``[bold]`` or ``[/]`` in a task's name or message, or ``:warning:``, are
printed as they came, neither raising nor styling, in the progress lines, in the live table
on a terminal, and in the tables of a command's result. Events are shaped as ansible-runner
emits them (tests/unit/test_progress.py)."""

from __future__ import annotations

import io

from rich.console import Console

from gpuprov.ansible.progress import PlaybookProgress

TASK = "stat [/dev/nvidia0] [bold]"
MSG = "cannot stat [/dev/nvidia0]: No such file or directory [/] [red]x[/red] :warning:"
WHY = "ssh: connect to host [::1] port 22: [/] refused"


def _events() -> list[dict]:
    def ev(event: str, host: str, **data) -> dict:
        return {"event": event, "event_data": {"host": host, **data}}

    return [
        ev("runner_on_start", "a", task=TASK, role="gpu_[b]preflight", task_action="stat"),
        ev("runner_on_ok", "a", task=TASK, role="gpu_[b]preflight", task_action="stat", res={"changed": True}),
        ev("runner_on_failed", "a", task=TASK, role="gpu_[b]preflight", task_action="stat", res={"msg": MSG}),
        ev("runner_on_unreachable", "b", task="Gathering Facts", res={"msg": WHY}),
    ]


def test_node_text_in_the_progress_lines_is_printed_as_it_came() -> None:
    out = io.StringIO()
    progress = PlaybookProgress(["a", "b"], "provision [x]", console=Console(file=out, width=400))
    with progress:
        for event in _events():
            progress.handle(event)
    text = out.getvalue()
    assert "provision [x]: 2 node(s)" in text
    assert "  a: gpu_[b]preflight\n" in text
    assert f"  a: changed  gpu_[b]preflight : {TASK} [0:00]\n" in text  # [M:SS]: since the run began
    assert f"  a: FAILED   gpu_[b]preflight : {TASK}: {MSG} [0:00]\n" in text
    assert "  b: UNREACHABLE ssh: connect to host [::1] port 22: [/] refused [0:00]\n" in text
    assert progress.errors()["a"] == f"gpu_[b]preflight : {TASK}: {MSG}"


def test_node_text_in_the_live_table_is_printed_as_it_came() -> None:
    out = io.StringIO()
    # A terminal (the live table), without colour codes so that the text reads back as shown.
    console = Console(file=out, width=400, force_terminal=True, color_system=None)
    progress = PlaybookProgress(["a", "b[/]"], "provision [bold]c", console=console)
    assert progress.interactive
    with progress:
        for event in _events()[:2]:
            progress.handle(event)
    text = out.getvalue()
    assert "provision [bold]c" in text and "b[/]" in text
    assert f"gpu_[b]preflight : {TASK}" in text


def test_node_text_in_a_result_table_is_printed_as_it_came(capsys, monkeypatch) -> None:
    from gpuprov.cli import output as cli_output

    monkeypatch.setenv("COLUMNS", "200")  # the detail on one line (under xdist COLUMNS may say 80)
    from gpuprov.results.shapes import ProbeRow, VerifyResult, VerifySummary

    data = VerifyResult(cluster="c", ok=False, hosts={"n[1]": [ProbeRow("gpus_on_pci_bus", "fail", MSG)]},
                        summary=VerifySummary(pass_=0, fail=1, skip=0))
    cli_output.verify_table("c", data)
    out = capsys.readouterr().out
    assert "n[1]" in out and "cannot stat [/dev/nvidia0]: No such file or directory [/] [red]x[/red]" in out
    assert ":warning:" in out
