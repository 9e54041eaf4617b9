#!/usr/bin/env python3
"""gpuprov benchmarks: figures, not pass/fail.

    python benchmarks/run.py [--nodes 2] [--startup-runs 20]

Reports:
  - CLI start-up: median wall time of `gpuprov --help`;
  - launch: `up --no-bootstrap` of N local nodes (containers + SSH-ready);
  - converge: first `provision` of the fresh nodes, total and per node;
  - no-op re-run: a second `provision` (nothing to change);
  - verify: `verify --level quick`;
  - health: `health` (the quick level), the gate `up` and every patch batch add.
Writes bench-results/<timestamp>.json. Needs the Docker engine and node image
(`make host-setup`). Uses its own GPUPROV_HOME and removes its cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPUPROV = str(Path(sys.executable).parent / "gpuprov")


def timed(*args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([GPUPROV, *args], capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"gpuprov {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--startup-runs", type=int, default=20)
    args = parser.parse_args()

    home = tempfile.mkdtemp(prefix="gpuprov-bench-")
    env = {**os.environ, "GPUPROV_HOME": home, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    results: dict[str, object] = {"nodes": args.nodes, "machine": os.uname().nodename,
                                  "cpus": os.cpu_count()}

    timed("--help", env=env)  # warm the page cache once
    samples = [timed("--help", env=env) for _ in range(args.startup_runs)]
    results["cli_help_median_ms"] = round(statistics.median(samples) * 1000, 1)
    results["cli_help_p90_ms"] = round(sorted(samples)[int(len(samples) * 0.9) - 1] * 1000, 1)

    name = f"bench-{secrets.token_hex(3)}"
    try:
        results["launch_s"] = round(timed("up", "--provider", "docker", "--count", str(args.nodes),
                                          "--name", name, "--no-bootstrap", env=env), 2)
        converge = timed("provision", name, env=env)
        results["converge_s"] = round(converge, 2)
        results["converge_per_node_s"] = round(converge / args.nodes, 2)
        results["noop_rerun_s"] = round(timed("provision", name, env=env), 2)
        results["check_mode_s"] = round(timed("provision", name, "--check", env=env), 2)
        results["verify_quick_s"] = round(timed("verify", name, env=env), 2)
        results["health_quick_s"] = round(timed("health", name, env=env), 2)
    finally:
        subprocess.run([GPUPROV, "down", name, "--yes"], env=env, capture_output=True, check=False)

    out_dir = ROOT / "bench-results"
    out_dir.mkdir(exist_ok=True)
    out = out_dir / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    width = max(map(len, results))
    for key, value in results.items():
        print(f"{key:<{width}}  {value}")
    print(f"(written to {out.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
