#!/usr/bin/env python3
"""gpuprov benchmark: from `up --scheduler slurm` to the first job answering (a figure, not a test).

    python benchmarks/slurm.py [--runs 1] [--image REF]

Two local nodes (the docker provider; the Docker engine, node image and package cache of
`make host-setup`). Each run times, from the start of the command:

    gpuprov up --provider docker --count 2 --name NAME --scheduler slurm --health off [...]

to the first `srun -N2 hostname -s` (run on the controller node as the nodes' user, over
`docker exec`, tried every half second) answering from both nodes; then `down`.

Which bootstrap it measures, said in the figures' names and the `mode` row:
  - baked: from a baked image (`--image REF`, else the newest one `gpuprov image list` shows
    in GPUPROV_BAKED_REPO), the whole site (a converge of an image that has the stack) and
    Slurm; the image is the `image` row;
  - tags: without one, `--tags rdma,slurm`: the node image and only the rdma and slurm plays
    (the e2e test's way: Slurm needs none of the GPU stack; the rdma play writes the NCCL
    settings every job gets). The GPU stack's from-scratch install (minutes, downloads) is
    left out.
Uses its own GPUPROV_HOME; removes its clusters. Writes bench-results/<time>.json and prints
the Markdown table of benchmarks/run.py.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import GPUPROV, down, figure, report  # a sibling script, not a package

SRUN = "srun -N2 hostname -s"


def _newest_baked(env: dict[str, str]) -> str | None:
    """The newest docker image `gpuprov image list` shows (oldest first), if any."""
    proc = subprocess.run([GPUPROV, "image", "list", "-o", "json"], capture_output=True, text=True, env=env,
                          check=False, stdin=subprocess.DEVNULL)
    refs = [i["ref"] for i in json.loads(proc.stdout or "[]") if i.get("provider") == "docker"] \
        if proc.returncode == 0 else []
    return refs[-1] if refs else None


def _container(node: str) -> str:
    return subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={node}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def one_run(name: str, env: dict[str, str], extra: list[str], timeout: float) -> dict[str, float | str]:
    """Seconds from the start of `up` to its end and to the first two-node srun answering."""
    start = time.perf_counter()
    proc = subprocess.run([GPUPROV, "up", "--provider", "docker", "--count", "2", "--name", name,
                           "--scheduler", "slurm", "--health", "off", "-o", "json", *extra],
                          capture_output=True, text=True, env=env, check=False, stdin=subprocess.DEVNULL)
    up_done = time.perf_counter()
    if proc.returncode != 0:
        sys.exit(f"gpuprov up failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    nodes = sorted(n["name"] for n in json.loads(proc.stdout)["nodes"])
    cid = _container(nodes[0])
    deadline = up_done + timeout
    while True:
        job = subprocess.run(["docker", "exec", "-u", "gpuprov", cid, "sh", "-c", SRUN], capture_output=True,
                             text=True, check=False, timeout=120)
        if job.returncode == 0 and sorted(job.stdout.split()) == nodes:
            answered = time.perf_counter()
            break
        if time.perf_counter() > deadline:
            sys.exit(f"{SRUN} did not answer from {nodes} within {timeout:.0f}s after up: "
                     f"{job.stdout.strip()} {job.stderr.strip()}")
        time.sleep(0.5)
    return {"up_s": up_done - start, "first_srun_s": answered - start, "srun_after_up_s": answered - up_done,
            "srun_output": " ".join(job.stdout.split())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--image", metavar="REF", help="boot from this baked image (of the docker-node lock)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds srun may take to answer after up")
    args = parser.parse_args()

    env = {**os.environ, "GPUPROV_HOME": tempfile.mkdtemp(prefix="gpuprov-bench-slurm-"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    image = args.image or _newest_baked(env)
    mode = "baked" if image else "tags"
    extra = ["--image", image] if image else ["--tags", "rdma,slurm"]
    results: dict[str, object] = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "mode": mode,
                                  "image": image or "gpuprov/node:bookworm (no baked image)",
                                  "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    samples: dict[str, list[float]] = {"up_s": [], "first_srun_s": [], "srun_after_up_s": []}
    clusters: list[str] = []
    try:
        for i in range(args.runs):
            name = f"bench-slurm-{secrets.token_hex(3)}-{i}"
            clusters.append(name)
            found = one_run(name, env, extra, args.timeout)
            for key in samples:
                samples[key].append(float(found[key]))
            results["srun_output"] = found["srun_output"]
            down(name, env)
        for key, values in samples.items():
            results[f"slurm_up2_{mode}_{key}"] = figure(values)
    finally:
        for name in clusters:
            down(name, env)
        report(results)


if __name__ == "__main__":
    main()
