"""What a run's plays manage on each node, from the task results Ansible reported (never a
list kept by hand): the files, packages, services the tasks that ran there touched.

A result is what gpuprov.ansible.progress keeps of each task that ran on a node (its action and
the part of Ansible's result that names what it worked on). Sysctl keys and kernel modules come
from the managed files that set them, found on the node (gpuprov.manifest.node.derived).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The module (its short name) -> the kind of item it manages.
KINDS = {
    **dict.fromkeys(("copy", "template", "file", "lineinfile", "blockinfile", "get_url", "unarchive",
                     "replace", "ini_file"), "path"),
    **dict.fromkeys(("apt", "package", "dpkg_selections"), "package"),
    **dict.fromkeys(("service", "systemd", "systemd_service"), "service"),
}
_PREFIXES = ("ansible.builtin.", "ansible.legacy.")


def short(action: str) -> str:
    for prefix in _PREFIXES:
        if action.startswith(prefix):
            return action[len(prefix):]
    return action


def _args(res: Mapping[str, Any]) -> Mapping[str, Any]:
    invocation = res.get("invocation")
    args = invocation.get("module_args") if isinstance(invocation, Mapping) else None
    return args if isinstance(args, Mapping) else {}


def _names(value: Any) -> list[str]:
    """A package argument (a name, a list, or a comma-separated string) as names, versions cut."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        return []
    out = []
    for raw in value:
        name = str(raw).strip().split("=", 1)[0]
        # A .deb file, a URL or a pattern names no one package.
        if name and not any(c in name for c in "/*?[") and not name.endswith(".deb"):
            out.append(name)
    return out


def items_of(action: str, res: Mapping[str, Any]) -> list[dict[str, str]]:
    """The items one task result names (a loop's results each in turn)."""
    loop = res.get("results")
    if isinstance(loop, list):
        return [item for r in loop if isinstance(r, Mapping) and not r.get("skipped") and not r.get("failed")
                for item in items_of(action, r)]
    kind = KINDS.get(short(action))
    args = _args(res)
    if kind == "path":
        path = res.get("dest") or res.get("path") or args.get("dest") or args.get("path")
        return [{"kind": "path", "name": path}] if isinstance(path, str) and path.startswith("/") else []
    if kind == "package":
        names = _names(args.get("name") if args.get("name") is not None else args.get("pkg"))
        return [{"kind": "package", "name": n} for n in names]
    if kind == "service":
        name = res.get("name") or args.get("name")
        return [{"kind": "service", "name": name}] if isinstance(name, str) and name else []
    return []


def collect(results: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One node's items, sorted, each once, from its task results ({"action", "res"})."""
    found = {(i["kind"], i["name"]): i for r in results for i in items_of(str(r.get("action") or ""),
                                                                           r.get("res") or {})}
    return [found[k] for k in sorted(found)]


def from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, list[dict[str, str]]]:
    """Each host's items from ansible-runner's events as they are (a run's job_events)."""
    per_host: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("event") != "runner_on_ok":
            continue
        data = event.get("event_data") or {}
        if data.get("host"):
            per_host.setdefault(data["host"], []).append({"action": data.get("task_action"), "res": data.get("res")})
    return {host: collect(results) for host, results in per_host.items()}
