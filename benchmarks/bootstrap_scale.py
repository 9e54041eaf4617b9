#!/usr/bin/env python3
"""Bootstrap time and controller cost in the node count, push vs pull (`make bench`).

    python benchmarks/bootstrap_scale.py [--sizes 1,4,8,16] [--modes push,pull] [--tags T] [--runs 1]

For each N and mode: `gpuprov up --provider docker --count N --bootstrap MODE --tags T
--health off` on fresh local nodes, timed from the command's start to its end (launch,
SSH wait, bootstrap; in pull mode also the nodes' own probe runs), with the CPU time and
peak memory of the controller (the `up` process and everything it started: ansible-playbook
and its forks in push mode; the bundle build and the HTTP server in pull mode), and T(N)/T(1)
per mode. The nodes are removed after each run.

The plays are `--tags` (default: preflight,spot, which install nothing: what remains is
Ansible's own work per task, the part that scales with the node count) because 16 full-stack
nodes do not fit this machine (about 3 GB of disk and a DKMS build each). On one machine
the nodes share its CPUs with the controller, so a pull run's time grows with N here for a
reason a fleet does not have (each EC2 node has its own CPUs); the controller's CPU per node
is the figure that carries over. Writes bench-results/bootstrap-<time>.json and prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUPROV = str(Path(sys.executable).parent / "gpuprov")


def measured(args: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall time, and CPU and peak RSS of the process tree (as the kernel accounts waited-for
    children: every process gpuprov started and waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([GPUPROV, *args], capture_output=True, text=True, env=env, check=False,
                          stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"gpuprov {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": round(wall, 2),
            "controller_cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
            "controller_peak_rss_mb": round(after.ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--modes", default="push,pull")
    parser.add_argument("--tags", default="preflight,spot")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    modes = args.modes.split(",")
    home = tempfile.mkdtemp(prefix="gpuprov-bench-")
    env = {**os.environ, "GPUPROV_HOME": home, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("GPUPROV_REGISTRY_PASSWORD", None)
    results: dict[str, object] = {"cpus": os.cpu_count(), "tags": args.tags,
                                  "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": {}}
    table = {}
    for n in sizes:
        for mode in modes:
            samples = []
            for _ in range(args.runs):
                name = f"bs-{mode}-{n}-{secrets.token_hex(2)}"
                try:
                    samples.append(measured(["up", "--provider", "docker", "--count", str(n), "--name", name,
                                             "--bootstrap", mode, "--tags", args.tags, "--health", "off",
                                             "--no-baked"], env))
                finally:
                    subprocess.run([GPUPROV, "down", name, "--yes"], env=env, capture_output=True, check=False)
            row = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            row["controller_cpu_s_per_node"] = round(row["controller_cpu_s"] / n, 2)
            table[(mode, n)] = row
            results["runs"][f"{mode}_{n}"] = {**row, "samples": samples}
            print(f"{mode} N={n}: {row}", file=sys.stderr)
    lines = ["| mode | N | up, wall (s) | T(N)/T(1) | controller CPU (s) | per node (s) | largest controller process (MB RSS) |",
             "|---|---|---|---|---|---|---|"]
    for mode in modes:
        first = table.get((mode, sizes[0]))
        for n in sizes:
            row = table[(mode, n)]
            ratio = round(row["wall_s"] / first["wall_s"], 2) if first else "-"
            lines.append(f"| {mode} | {n} | {row['wall_s']} | {ratio} | {row['controller_cpu_s']} | "
                         f"{row['controller_cpu_s_per_node']} | {row['controller_peak_rss_mb']} |")
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    path = out / f"bootstrap-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))
    print(f"\n(written: {path})")


if __name__ == "__main__":
    main()
