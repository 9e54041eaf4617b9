"""Ansible callback plugin of a pull bootstrap (shipped in the bootstrap bundle, run on the node).

Reports each task's start and outcome, and the final stats, as events in ansible-runner's
shape (``runner_on_start``, ``runner_on_ok``, ... ``playbook_on_stats``), so that the
controller shows them with the same per-node progress as a push run. Each event is appended
to the agent's event file (GPUPROV_PULL_EVENTS); the agent sends them to the controller.
Only what the progress shows leaves the node: task and role names, changed, and a failed
task's message; never a task's arguments or full result, but for one task: a patch's report
(REPORT_TASK), which `patch --via pull` reads as push reads it.

For the node's manifest (gpuprov.manifest: the agent writes it after a run of every play), each
successful task's items, the names of the files, packages and services it managed as
gpuprov.manifest.collect.items_of reads them from the result (push reads the same from its
events), are appended to a second file, GPUPROV_PULL_ITEMS, when the agent names one. It stays
on the node (the agent hands it to the manifest program): only names, each once, at most
MAX_ITEMS of them, none longer than MAX_NAME (past either, one ``overflow`` line, and the
agent writes no manifest).
"""

from __future__ import annotations

import json
import os
import threading

from ansible.plugins.callback import CallbackBase

# The bundle carries gpuprov (lib/gpuprov): the very reading of a result push uses.
from gpuprov.manifest.collect import items_of

DOCUMENTATION = """
name: gpuprov_pull
type: aggregate
short_description: report a pull bootstrap's tasks to the gpuprov agent
description: Appends each task's start and outcome as a JSON line to GPUPROV_PULL_EVENTS.
"""
MAX_ITEMS = 20_000  # distinct items of one run (the full site names about 100)
# The one task whose result leaves the node whole: node_patch's report of what a patch moved
# (gpuprov.core.patch_plan.REPORT_TASK, read by `patch --via pull` as push reads it from its
# events): package names and versions, kernel names, the reboot's reasons. Bounded by
# gpuprov/pull/reports.py's check of it.
REPORT_TASK = "Report the patch"
MAX_NAME = 4096  # characters in one name (a path's limit)


def _message(res: dict) -> str:
    for key in ("msg", "stderr", "reason"):
        value = res.get(key)
        if value:
            return str(value)[-2000:]
    for item in res.get("results") or ():
        if isinstance(item, dict) and item.get("failed"):
            return _message(item)
    return "failed"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuprov_pull"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._path = os.environ.get("GPUPROV_PULL_EVENTS", "")
        self._node = os.environ.get("GPUPROV_PULL_NODE", "")
        self._lock = threading.Lock()
        self._items_path = os.environ.get("GPUPROV_PULL_ITEMS", "")
        self._items: set[tuple[str, str]] = set()
        self._full = False  # past MAX_ITEMS (or a name past MAX_NAME): no more kept

    def _emit(self, event: str, data: dict) -> None:
        if not self._path:
            return
        line = json.dumps({"event": event, "event_data": data}) + "\n"
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write(line)

    def _task(self, task, host: str | None = None) -> dict:
        role = task._role.get_name() if task._role else ""
        # The task's own name (get_name() puts the role before it; the progress adds it itself).
        # Cut to the length the controller takes (MAX_TEXT in gpuprov/pull/reports.py).
        return {"host": self._node or host, "task": str(task.name or task.action)[:4000], "role": str(role)[:4000],
                "task_action": str(task.action)[:4000]}

    def v2_runner_on_start(self, host, task) -> None:
        self._emit("runner_on_start", self._task(task, host.get_name()))

    def _result(self, event: str, result, res: dict) -> None:
        data = self._task(result._task, result._host.get_name())
        data["res"] = res
        self._emit(event, data)

    def _keep_items(self, result) -> None:
        """The names this result's task managed, each new one a line of the items file."""
        if not self._items_path:
            return
        lines = []
        with self._lock:
            for item in items_of(str(result._task.action), result._result):
                key = (str(item["kind"]), str(item["name"]))
                if self._full or key in self._items:
                    continue
                self._items.add(key)
                if len(self._items) > MAX_ITEMS or len(key[1]) > MAX_NAME:
                    # Said once; nothing more is kept, and the agent writes no manifest.
                    self._full = True
                    lines.append({"kind": "overflow", "name": f"more than {MAX_ITEMS} items"
                                  if len(self._items) > MAX_ITEMS else f"a name of {len(key[1])} characters"})
                    continue
                lines.append({"kind": key[0], "name": key[1]})
            if lines:
                with open(self._items_path, "a", encoding="utf-8") as out:
                    out.writelines(json.dumps(line) + "\n" for line in lines)

    def v2_runner_on_ok(self, result) -> None:
        res = {"changed": bool(result._result.get("changed"))}
        report = result._result.get("msg")
        if result._task.name == REPORT_TASK and isinstance(report, dict):
            res["report"] = json.loads(json.dumps(report, default=str))  # plain JSON, not Ansible's types
        self._result("runner_on_ok", result, res)
        self._keep_items(result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        data = self._task(result._task, result._host.get_name())
        data["res"] = {"msg": _message(result._result)}
        data["ignore_errors"] = bool(ignore_errors)
        self._emit("runner_on_failed", data)

    def v2_runner_on_skipped(self, result) -> None:
        self._result("runner_on_skipped", result, {})

    def v2_runner_on_unreachable(self, result) -> None:
        self._result("runner_on_unreachable", result, {"msg": _message(result._result)})

    def v2_playbook_on_stats(self, stats) -> None:
        hosts = sorted(stats.processed.keys())
        sums = {"ok": stats.ok, "changed": stats.changed, "failures": stats.failures,
                "dark": stats.dark, "skipped": stats.skipped}
        self._emit("playbook_on_stats", {
            key: {self._node or h: int(values.get(h, 0)) for h in hosts} for key, values in sums.items()
        })
