"""CPU-seconds of every Docker container while a run goes on (not a test): the nodes' side of a
unit's CPU, which `make test`'s own table (tests/conftest.py, "CPU-seconds per unit on this
side") cannot see.

Every few seconds it reads each running container's CPU counter from its cgroup (v1
cpuacct.usage or v2 cpu.stat) and its name and labels from Docker's own record, and rewrites
OUT (JSON: one row per container, the last counter seen, first and last time seen). A container
removed between two samples loses at most the last few seconds of its CPU.

    python benchmarks/container_cpu.py OUT [--every 2]     # until stopped (SIGTERM or Ctrl-C)
    python benchmarks/container_cpu.py OUT --summary       # rows summed by cluster label or name
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

CGROUPS = (Path("/sys/fs/cgroup/cpuacct/docker"), Path("/sys/fs/cgroup/cpu,cpuacct/docker"),
           Path("/sys/fs/cgroup/system.slice"), Path("/sys/fs/cgroup/docker"))
DOCKER = Path("/var/lib/docker/containers")
CLUSTER_LABEL = "gpuprov.cluster"


def usage_s(group: Path) -> float | None:
    try:
        if (group / "cpuacct.usage").exists():
            return int((group / "cpuacct.usage").read_text()) / 1e9
        for line in (group / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        return None
    return None


def containers() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in CGROUPS:
        if not root.is_dir():
            continue
        for group in root.iterdir():
            cid = group.name.removeprefix("docker-").removesuffix(".scope")
            if len(cid) == 64 and group.is_dir():
                found.setdefault(cid, group)
    return found


def describe(cid: str) -> dict[str, object]:
    try:
        config = json.loads((DOCKER / cid / "config.v2.json").read_text())
    except (OSError, ValueError):
        return {"name": cid[:12], "labels": {}}
    return {"name": config.get("Name", "").lstrip("/"), "labels": (config.get("Config") or {}).get("Labels") or {}}


def sample(out: Path, every: float) -> None:
    rows: dict[str, dict[str, object]] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop:
            now = time.time()
            for cid, group in containers().items():
                used = usage_s(group)
                if used is None:
                    continue
                row = rows.setdefault(cid, {**describe(cid), "first": now})
                row["cpu_s"], row["last"] = round(used, 2), now
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            tmp.replace(out)
            time.sleep(every)
    except KeyboardInterrupt:
        pass


def summary(out: Path) -> None:
    rows = json.loads(out.read_text())
    by: dict[str, list[float]] = {}
    for row in rows.values():
        key = row["labels"].get(CLUSTER_LABEL) or row["name"]
        by.setdefault(key, []).append(row["cpu_s"])
    for key, cpu in sorted(by.items(), key=lambda kv: -sum(kv[1])):
        print(f"{sum(cpu):8.0f}  {len(cpu):3d}  {key}")
    print(f"{sum(sum(c) for c in by.values()):8.0f}  all containers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    if args.summary:
        summary(args.out)
    else:
        sample(args.out, args.every)


if __name__ == "__main__":
    sys.exit(main())
