"""Where one recorded Ansible run spent its time: per role and the slowest tasks, per node.

    python benchmarks/run_profile.py RUN_DIR [--top 15] [--json]

RUN_DIR is a run gpuprov recorded (``$GPUPROV_HOME/clusters/NAME/runs/STAMP-KIND``; `gpuprov
status NAME` lists them): ansible-runner's events there (``artifacts/ansible/job_events``) carry
each task's start, end and duration on each host. Task time is the task's own on that host,
from its result event (a looped task once, by its own event, which spans all its items); fact
gathering counts as a task. What the tasks do not account for of the run's wall time is the
controller's between tasks. Each task result, a skipped one too, costs the controller a worker
process and a merge of the task's variables (about 30 ms of its CPU on a 2-core Intel Xeon), so
the skipped results are counted per task file: where a group of tasks that skip together could
be one include. Reads files only: nothing is run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")


def _events(run_dir: Path) -> list[dict]:
    found = run_dir / "artifacts" / "ansible" / "job_events"
    if not found.is_dir():
        raise SystemExit(f"{run_dir}: no artifacts/ansible/job_events (not a gpuprov run directory?)")
    events = []
    for path in found.glob("*.json"):
        try:
            events.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: unreadable event ({exc})") from None
    return sorted(events, key=lambda e: e.get("counter", 0))


def profile(run_dir: Path, top: int) -> dict:
    events = _events(run_dir)
    by_role: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    tasks: dict[tuple[str, str, str], float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    skipped: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    stamps = [datetime.fromisoformat(e["created"]) for e in events if e.get("created")]
    for e in events:
        if e.get("event") not in RESULT_EVENTS:
            continue
        data = e.get("event_data") or {}
        duration = float(data.get("duration") or 0.0)
        host, role = data.get("host", "?"), data.get("role") or "(play)"
        by_role[host][role] += duration
        tasks[(host, role, data.get("task", "?"))] += duration
        count[host] += 1
        if e.get("event") == "runner_on_skipped":
            where = str(data.get("task_path") or "?").rsplit(":", 1)[0]
            skipped[host][_short(where)] += 1
    wall = (max(stamps) - min(stamps)).total_seconds() if stamps else 0.0
    hosts = {}
    for host, roles in sorted(by_role.items()):
        in_tasks = sum(roles.values())
        hosts[host] = {
            "task_results": count[host],
            "skipped": sum(skipped[host].values()),
            "skipped_by_file": dict(sorted(skipped[host].items(), key=lambda kv: (-kv[1], kv[0]))[:top]),
            "in_tasks_s": round(in_tasks, 1),
            "roles_s": {r: round(s, 1) for r, s in sorted(roles.items(), key=lambda kv: -kv[1])},
            "slowest_tasks": [{"role": r, "task": t, "s": round(s, 1)} for (h, r, t), s
                              in sorted(tasks.items(), key=lambda kv: -kv[1]) if h == host][:top],
        }
    return {"run": str(run_dir), "wall_s": round(wall, 1), "hosts": hosts}


def _short(path: str) -> str:
    """A task file's path from its ``roles/`` or ``playbooks/`` folder on."""
    parts = Path(path).parts
    for anchor in ("roles", "playbooks"):
        if anchor in parts:
            return str(Path(*parts[len(parts) - 1 - parts[::-1].index(anchor):]))
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = profile(args.run_dir, args.top)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['run']}: {report['wall_s']} s of wall time")
    for host, h in report["hosts"].items():
        print(f"\n{host}: {h['task_results']} task results ({h['skipped']} skipped), {h['in_tasks_s']} s in tasks")
        print("  role                          s")
        for role, s in h["roles_s"].items():
            print(f"  {role:<28} {s:>7.1f}")
        print("  slowest tasks")
        for t in h["slowest_tasks"]:
            print(f"  {t['s']:>7.1f}  {t['role']}: {t['task']}")
        if h["skipped_by_file"]:
            print("  skipped, by task file")
            for where, n in h["skipped_by_file"].items():
                print(f"  {n:>7}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
