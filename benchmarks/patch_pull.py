#!/usr/bin/env python3
"""The controller's cost of a `patch` roll, push against pull (`--via pull`), on local nodes
(`make bench`; a figure, not a test).

    python benchmarks/patch_pull.py [--count 2] [--tags preflight,spot,rdma,microcode] [--runs 2]

One cluster of COUNT local nodes is bootstrapped (push, the plays of TAGS: those a microcode
patch needs), then, alternating push and pull, RUNS times each: `gpuprov patch NAME
--microcode --check` (the plan: every node runs patch.yml in check mode; pull adds its probes,
the baseline a real roll takes next) and `gpuprov patch NAME --microcode --batch COUNT` after
one node's microcode package was removed (the plan, the baseline, one batch that moves it, the
probes and the quick health checks after it). Measured: the wall time, the CPU of the
controller (the gpuprov process and everything it started and waited for: ansible-playbook and
its forks, testinfra, SSH) and of the node containers (their cgroups), as
benchmarks/bootstrap_scale.py measures them. Writes bench-results/patch-pull-<time>.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _in(container: str, script: str) -> None:
    subprocess.run(["docker", "exec", "-i", container, "bash", "-s"], input=script, text=True, check=True,
                   capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--tags", default="preflight,spot,rdma,microcode")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    from bootstrap_scale import measured, node_cpu_s

    home = tempfile.mkdtemp(prefix="gpuprov-bench-")
    env = {**os.environ, "GPUPROV_HOME": home}
    name = f"pb-{secrets.token_hex(3)}"
    package = "intel-microcode" if "GenuineIntel" in Path("/proc/cpuinfo").read_text() else "amd64-microcode"
    rows = []
    try:
        up = measured(["up", "--provider", "docker", "--count", str(args.count), "--name", name, "--bootstrap",
                       "push", "--tags", args.tags, "--health", "off"], env)
        print(f"up: {up}", file=sys.stderr)
        for run in range(1, args.runs + 1):
            for via in ("push", "pull"):
                steps = (("plan (--check)", ["--check"]), ("roll, 1 node moves", ["--batch", str(args.count)]))
                for what, extra in steps:
                    if extra[0] != "--check":
                        _in(f"gpuprov-{name}-node-1", f"dpkg -r {package} >/dev/null")
                    nodes_before = node_cpu_s(name)
                    got = measured(["patch", name, "--microcode", "--via", via, *extra], env, accept=(0,))
                    got["nodes_cpu_s"] = round(node_cpu_s(name) - nodes_before, 2)
                    rows.append({"run": run, "via": via, "what": what, "count": args.count, **got})
                    print(rows[-1], file=sys.stderr)
    finally:
        subprocess.run([str(ROOT / ".venv" / "bin" / "gpuprov"), "down", name, "--yes"], env=env,
                       capture_output=True, check=False)
    out = ROOT / "bench-results" / f"patch-pull-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"count": args.count, "tags": args.tags, "rows": rows}, indent=1) + "\n")
    print("| run | what | via | wall (s) | controller CPU (s) | nodes' CPU (s) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['what']} | {r['via']} | {r['wall_s']} | {r['controller_cpu_s']} "
              f"| {r['nodes_cpu_s']} |")
    print(f"({args.count} local nodes, plays {args.tags}; {out.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
