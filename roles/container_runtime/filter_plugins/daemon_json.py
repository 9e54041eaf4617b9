"""Filters of the container_runtime role: /etc/docker/daemon.json merged key by key.

Only the keys gpuprov owns change: runtimes.nvidia, default-runtime (when asked),
the default-ulimits it sets, and entries it adds to registry-mirrors and
insecure-registries. Every other key, and every other entry of those, stays.
"""

from __future__ import annotations

from typing import Any

# /proc/<pid>/limits row for each ulimit name docker knows.
_PROC_LIMITS = {
    "memlock": "Max locked memory",
    "stack": "Max stack size",
    "nofile": "Max open files",
    "nproc": "Max processes",
    "core": "Max core file size",
}


def _union(current: Any, extra: list[str]) -> list[str]:
    out = list(current or [])
    out += [item for item in extra if item not in out]
    return out


def daemon_json_merge(current: dict[str, Any], runtime_path: str, make_default: bool,
                      ulimits: dict[str, dict[str, int]], mirrors: list[str],
                      insecure: list[str]) -> dict[str, Any]:
    if not isinstance(current, dict):
        raise ValueError("daemon.json must hold a JSON object")
    out = dict(current)
    runtimes = dict(out.get("runtimes") or {})
    nvidia = dict(runtimes.get("nvidia") or {})
    nvidia["path"] = runtime_path
    runtimes["nvidia"] = nvidia
    out["runtimes"] = runtimes
    if make_default:
        out["default-runtime"] = "nvidia"
    if ulimits:
        merged = dict(out.get("default-ulimits") or {})
        for name, value in ulimits.items():
            merged[name] = {"Name": name, "Hard": int(value["hard"]), "Soft": int(value["soft"])}
        out["default-ulimits"] = merged
    if mirrors:
        out["registry-mirrors"] = _union(out.get("registry-mirrors"), mirrors)
    if insecure:
        out["insecure-registries"] = _union(out.get("insecure-registries"), insecure)
    return out


def proc_limits(text: str) -> dict[str, int]:
    """Hard limits from /proc/<pid>/limits, by docker's ulimit name (-1: unlimited)."""
    out = {}
    for name, row in _PROC_LIMITS.items():
        for line in text.splitlines():
            if line.startswith(row):
                hard = line[len(row):].split()[1]
                out[name] = -1 if hard == "unlimited" else int(hard)
    return out


def can_raise_limits(text: str) -> bool:
    """Whether PID 1's bounding set (``CapBnd:`` of /proc/1/status) holds CAP_SYS_RESOURCE (24):
    without it nothing on the node goes above its own hard limits."""
    for line in text.splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> 24 & 1)
    return True


def ulimits_within(wanted: dict[str, dict[str, int]], hard: dict[str, int]) -> dict[str, dict[str, int]]:
    """``wanted`` lowered to ``hard`` where the node cannot go above its own hard limits."""

    def clamp(value: int, cap: int) -> int:
        if cap == -1:
            return int(value)
        return cap if int(value) == -1 else min(int(value), cap)

    return {name: {key: clamp(v, hard.get(name, -1)) for key, v in value.items()}
            for name, value in wanted.items()}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "daemon_json_merge": daemon_json_merge,
            "proc_limits": proc_limits,
            "can_raise_limits": can_raise_limits,
            "ulimits_within": ulimits_within,
        }
