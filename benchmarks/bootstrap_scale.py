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


def _tree_rss_kb(root: int) -> int:
    """The resident memory of ``root`` and all its descendants now (kB, from /proc)."""
    parents, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        parents[int(entry)] = int(fields.get("PPid", "0").strip() or 0)
        rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0] or 0)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += [p for p, parent in parents.items() if parent == pid]
    return total


def measured(args: list[str], env: dict[str, str], accept: tuple[int, ...] = (0,)) -> dict[str, float]:
    """Wall time; CPU of the process tree (as the kernel accounts waited-for children: every
    process gpuprov started and waited for); the tree's peak resident memory (sampled 5 times
    a second)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a long run's output never blocks it
        proc = subprocess.Popen([GPUPROV, *args], stdout=log, stderr=log, text=True, env=env,
                                stdin=subprocess.DEVNULL)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss_kb(proc.pid))
            time.sleep(0.2)
        log.seek(0)
        err = log.read()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in accept:
        sys.exit(f"gpuprov {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
    return {"wall_s": round(wall, 2),
            "controller_cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 2),
            "controller_peak_mb": round(peak / 1024, 1)}


def node_cpu_s(name: str) -> float:
    """CPU the cluster's node containers used since they started (their cgroups, v1 or v2)."""
    ids = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label=gpuprov.cluster={name}"],
                         capture_output=True, text=True, check=True).stdout.split()
    total = 0.0
    for cid in ids:
        v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
        v2 = [Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
              Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat")]
        if v1.exists():
            total += int(v1.read_text()) / 1e9
            continue
        for path in v2:
            if path.exists():
                usage = dict(line.split() for line in path.read_text().splitlines())
                total += int(usage["usage_usec"]) / 1e6
                break
    return round(total, 2)


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
                    got = measured(["up", "--provider", "docker", "--count", str(n), "--name", name, "--bootstrap",
                                    mode, "--tags", args.tags, "--health", "off", "--no-baked"], env)
                    if mode == "push":  # the same work as pull's: its nodes also run the probes
                        # exit 1: with --tags, the probes of the plays left out fail (on pull nodes too)
                        probes = measured(["verify", name], env, accept=(0, 1))
                        got = {"wall_s": round(got["wall_s"] + probes["wall_s"], 2),
                               "controller_cpu_s": round(got["controller_cpu_s"] + probes["controller_cpu_s"], 2),
                               "controller_peak_mb": max(got["controller_peak_mb"], probes["controller_peak_mb"])}
                    got["node_cpu_s"] = node_cpu_s(name)
                    samples.append(got)
                finally:
                    subprocess.run([GPUPROV, "down", name, "--yes"], env=env, capture_output=True, check=False)
            row = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            row["controller_cpu_s_per_node"] = round(row["controller_cpu_s"] / n, 2)
            row["node_cpu_s_per_node"] = round(row["node_cpu_s"] / n, 2)
            table[(mode, n)] = row
            results["runs"][f"{mode}_{n}"] = {**row, "samples": samples}
            print(f"{mode} N={n}: {row}", file=sys.stderr)
    lines = ["| mode | N | to verified (s) | T(N)/T(1) | controller CPU (s) | per node | controller memory, peak (MB) "
             "| node CPU per node (s) |", "|---|---|---|---|---|---|---|---|"]
    for mode in modes:
        first = table.get((mode, sizes[0]))
        for n in sizes:
            row = table[(mode, n)]
            ratio = round(row["wall_s"] / first["wall_s"], 2) if first else "-"
            lines.append(f"| {mode} | {n} | {row['wall_s']} | {ratio} | {row['controller_cpu_s']} | "
                         f"{row['controller_cpu_s_per_node']} | {row['controller_peak_mb']} | "
                         f"{row['node_cpu_s_per_node']} |")
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    path = out / f"bootstrap-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))
    print(f"\n(written: {path})")


if __name__ == "__main__":
    main()
