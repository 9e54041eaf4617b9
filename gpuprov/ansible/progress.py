"""Per-node live progress from Ansible's event stream (never from stdout).

On a terminal: a rich table, one row per node, with its current role/task
and ok/changed/failed counts. Elsewhere (CI logs, pipes): one line per
node the first time it starts a role (a role its plays include again, as
every play includes gpuprov_base, is not said again), and one per change or
failure with the time since the run began (``[1:05]``). What a node says
(task names, messages) is printed as text, never read as rich markup: a
message such as ``cannot stat [/dev/nvidia0]`` is shown as it came.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuprov.node_text import printable_data
from gpuprov.ssh import ssh_error_line

if TYPE_CHECKING:
    from rich.live import Live


@dataclass
class HostState:
    host: str
    task: str = "waiting"
    role: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    tasks: int = 0  # tasks that ran on the node, fact gathering not counted
    error: str | None = None
    done: bool = False
    roles: set[str] = field(default_factory=set)  # the roles said so far (piped output)


# Fact gathering runs under any --tags selection: it is not a task of the play.
FACT_ACTIONS = frozenset({"gather_facts", "setup", "ansible.builtin.gather_facts", "ansible.builtin.setup"})

# What is kept of each task that ran on a node (gpuprov.manifest.collect reads it): the keys of
# a result, and of its module arguments, that name what the task worked on; a loop's results
# each the same way. Nothing else of a result is kept (contents, diffs, output).
RESULT_KEYS = ("dest", "path", "name", "state")
ARG_KEYS = ("dest", "path", "name", "pkg", "state", "selection", "deb")


def kept_result(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: res[k] for k in RESULT_KEYS if isinstance(res.get(k), (str, list))}
    args = (res.get("invocation") or {}).get("module_args") if isinstance(res.get("invocation"), dict) else None
    if isinstance(args, dict):
        out["invocation"] = {"module_args": {k: args[k] for k in ARG_KEYS if k in args}}
    for flag in ("skipped", "failed"):
        if res.get(flag):
            out[flag] = True
    if isinstance(res.get("results"), list):
        out["results"] = [kept_result(r) for r in res["results"] if isinstance(r, dict)]
    return out


def _msg(res: dict[str, Any]) -> str:
    for key in ("msg", "stderr", "reason"):
        value = res.get(key)
        if value:
            text = str(value).strip().splitlines()
            return text[-1] if key == "stderr" else " ".join(text)
    results = res.get("results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict) and item.get("failed"):
                return _msg(item)
    return "failed"


# Where Ansible's unreachable message stops talking and quotes OpenSSH.
_SSH_QUOTE = ("Failed to connect to the host via ssh:", "can be reached over ssh:")


def unreachable_reason(res: dict[str, Any]) -> str:
    """Why Ansible could not reach a host, in one line: OpenSSH's own last line, without
    Ansible's wrapping; a host key mismatch said plainly."""
    raw = str(res.get("msg") or res.get("stderr") or "")
    for marker in _SSH_QUOTE:
        if marker in raw:
            raw = raw.split(marker, 1)[1]
            break
    return ssh_error_line(raw) if raw.strip() else "unreachable (no reason given)"


class PlaybookProgress:
    def __init__(self, hosts: Iterable[str], title: str, console: Any | None = None) -> None:
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self.title = title
        self.hosts = {h: HostState(h) for h in hosts}
        # Per node, each task that ran there ok: {"action", "res": kept_result(...)}.
        self.results: dict[str, list[dict[str, Any]]] = {h: [] for h in hosts}
        # Per node, the name of each task that reported a change (in check mode: would change).
        self.changed_tasks: dict[str, list[str]] = {h: [] for h in hosts}
        self.stats: dict[str, Any] | None = None
        self.live: Live | None = None
        self.interactive = self.console.is_terminal
        self.started = time.monotonic()

    # -- context --------------------------------------------------------------
    def __enter__(self) -> PlaybookProgress:
        if self.interactive:
            from rich.live import Live

            self.live = live = Live(self._table(), console=self.console, refresh_per_second=8, transient=False)
            live.__enter__()
        else:
            self.console.print(f"{self.title}: {len(self.hosts)} node(s)", highlight=False, markup=False, emoji=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.__exit__(None, None, None)

    # -- events -----------------------------------------------------------------
    def handle(self, event: dict[str, Any]) -> bool:
        event = printable_data(event)  # a node's words (task names, results): no escape reaches the terminal
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        state = self.hosts.get(host) if host else None
        if kind == "playbook_on_stats":
            self.stats = data
            for h in self.hosts.values():
                h.done = True
                h.task = "done"
        elif state is not None:
            self._host_event(kind, data, state)
        if self.live is not None:
            self.live.update(self._table())
        return True

    def _host_event(self, kind: str, data: dict[str, Any], h: HostState) -> None:
        res = data.get("res") or {}
        task = data.get("task") or ""
        role = data.get("role") or ""
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") \
                and data.get("task_action") not in FACT_ACTIONS:
            h.tasks += 1
        if kind == "runner_on_start":
            if role and role not in h.roles and not self.interactive:
                h.roles.add(role)
                self.console.print(f"  {h.host}: {role}", highlight=False, markup=False, emoji=False)
            h.role, h.task = role, f"{role} : {task}" if role else task
        elif kind == "runner_on_ok":
            h.ok += 1
            if data.get("task_action") not in FACT_ACTIONS:
                self.results.setdefault(h.host, []).append(
                    {"action": str(data.get("task_action") or ""), "res": kept_result(res)})
            if res.get("changed"):
                h.changed += 1
                self.changed_tasks.setdefault(h.host, []).append(task)
                if not self.interactive:
                    self._say(f"  {h.host}: changed  {h.task}")
        elif kind == "runner_on_skipped":
            h.skipped += 1
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                return
            h.failed += 1
            h.error = f"{h.task or task}: {_msg(res)}"
            if not self.interactive:
                self._say(f"  {h.host}: FAILED   {h.error}")
        elif kind == "runner_on_unreachable":
            h.unreachable += 1
            why = unreachable_reason(res)
            h.error = f"unreachable: {why}"
            # One line per node: Ansible drops an unreachable host from the rest of the run,
            # but a task that ignores unreachable hosts may report it again.
            if not self.interactive and h.unreachable == 1:
                self._say(f"  {h.host}: UNREACHABLE {why}")

    def _say(self, line: str) -> None:
        """A line of piped output with the time since the run began: ``... [1:05]``."""
        spent = int(time.monotonic() - self.started)
        self.console.print(f"{line} [{spent // 60}:{spent % 60:02d}]", highlight=False, markup=False, emoji=False)

    # -- rendering -----------------------------------------------------------------
    def _table(self):
        from rich.table import Table
        from rich.text import Text

        # Node names, tasks and roles are the node's words: text, never rich markup.
        table = Table(title=Text(self.title), title_justify="left", expand=False)
        table.add_column("node")
        table.add_column("task", overflow="ellipsis", max_width=60, no_wrap=True)
        for col in ("ok", "changed", "failed", "unreach"):
            table.add_column(col, justify="right")
        for h in self.hosts.values():
            style = "red" if (h.failed or h.unreachable) else ("green" if h.done else "")
            table.add_row(
                Text(h.host), Text(h.task), str(h.ok), str(h.changed), str(h.failed), str(h.unreachable),
                style=style,
            )
        return table

    # -- result ---------------------------------------------------------------------
    def summary(self) -> dict[str, dict[str, int]]:
        """Per host: ok, changed, failed, unreachable (Ansible's final stats when present),
        and the tasks that ran there (fact gathering not counted)."""
        out: dict[str, dict[str, int]] = {}
        for name, h in self.hosts.items():
            if self.stats is not None:
                out[name] = {
                    "ok": int(self.stats.get("ok", {}).get(name, 0)),
                    "changed": int(self.stats.get("changed", {}).get(name, 0)),
                    "failed": int(self.stats.get("failures", {}).get(name, 0)),
                    "unreachable": int(self.stats.get("dark", {}).get(name, 0)),
                    "tasks": h.tasks,
                }
            else:
                out[name] = {
                    "ok": h.ok,
                    "changed": h.changed,
                    "failed": h.failed,
                    "unreachable": h.unreachable,
                    "tasks": h.tasks,
                }
        return out

    def errors(self) -> dict[str, str]:
        return {h.host: h.error for h in self.hosts.values() if h.error}
