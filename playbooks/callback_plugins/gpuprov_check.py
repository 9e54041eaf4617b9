"""gpuprov's check-mode callback: the command tasks that would have run.

Ansible's check mode skips a ``command`` or ``shell`` task (it cannot know what the command
would do) and counts it as skipped, not changed: a plan of the whole site said "0 changed" and
the real run then held a package by ``apt-mark hold``. This callback writes each such task (but
one whose ``changed_when`` is false: a read), per host, as one JSON line to the file
``GPUPROV_WOULD_CHANGE`` names (set by gpuprov for a ``--check`` run, in the run's directory);
gpuprov counts them as changes the run would make and names them. Without the variable it does
nothing. Enabled by the ansible.cfg gpuprov writes (``callbacks_enabled``); found beside the
playbooks. A task its play skips in check mode by its own condition (``when: not
ansible_check_mode``) is not seen here.
"""

from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
    name: gpuprov_check
    type: aggregate
    short_description: In check mode, name the command tasks that would have run.
    description:
      - Writes host and task name of each task skipped because check mode cannot run its command
        (the command module's "Command would have run if not in check mode") to the file named by
        the GPUPROV_WOULD_CHANGE environment variable, one JSON object per line.
"""

WOULD_RUN = "Command would have run if not in check mode"


def _would_run(res: object) -> bool:
    if not isinstance(res, dict):
        return False
    if res.get("msg") == WOULD_RUN:
        return True
    items = res.get("results")
    return isinstance(items, list) and any(_would_run(item) for item in items)


def _never_changes(task: object) -> bool:
    """A command the play says never changes anything (``changed_when: false``: a read): check
    mode skipped it, the real run reports it unchanged, so it is no change to name."""
    conditions = getattr(task, "changed_when", None)
    if conditions in (None, "", []):
        return False
    items = conditions if isinstance(conditions, list) else [conditions]
    return all(c is False or str(c).strip().lower() in ("false", "no") for c in items)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuprov_check"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_on_skipped(self, result) -> None:
        path = os.environ.get("GPUPROV_WOULD_CHANGE")
        if not path or not _would_run(result._result) or _never_changes(result._task):
            return
        task = result._task
        # The task's own name, as ansible-runner's events give it (no "role : " before it).
        row = {"host": result._host.get_name(), "task": task.name or task.action}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
