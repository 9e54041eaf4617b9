#!/usr/bin/env python3
"""gpuprov benchmark: from `sbatch` with no dynamic node up to the job running on it (a figure,
not a test), on local nodes.

    python benchmarks/elastic.py [--runs 2]

One cluster of one static node (the docker provider, the node image, `--tags rdma,slurm`: the
e2e test's way) with two dynamic ones:

    gpuprov up --provider docker --count 1 --name NAME --scheduler slurm --max-count 3 --idle-minutes 1 ...

(its `up`, with the bake of the dynamic nodes' image, is the `up_s` figure). Each run waits for
both dynamic nodes to be powered down (`idle~`), then, as the nodes' user on the controller,
submits `sbatch -N2 --exclude=STATIC` of a script that prints the time it started, and takes
the time from just before `sbatch` to that (the containers share this machine's clock) as
`submit_to_running_s`, and to the job's end as `submit_to_done_s`. Each run costs the idle
minute and the power-down after it (about two and a half minutes). Uses its own GPUPROV_HOME
and baked image repository; removes its cluster. Writes bench-results/<time>.json and prints
the Markdown table of benchmarks/run.py.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import GPUPROV, down, figure, report  # a sibling script, not a package

JOB = "#!/bin/sh\ndate +%s.%N > /tmp/bench-started\nsrun hostname -s\n"


def _on(container: str, script: str, user: str = "root", timeout: int = 300) -> str:
    proc = subprocess.run(["docker", "exec", "-u", user, container, "sh", "-c", script], capture_output=True,
                          text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        sys.exit(f"{container}: {script}: {proc.stdout} {proc.stderr}")
    return proc.stdout


def _powered_down(controller: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = _on(controller, f"sinfo -h -N -n {name}-dy-[1-2] -o %t").split()
        gone = not subprocess.run(["docker", "ps", "-q", "--filter", f"name=^gpuprov-{name}-dy-"],
                                  capture_output=True, text=True, check=False).stdout.strip()
        if states and all(s == "idle~" for s in states) and gone:
            return
        time.sleep(2)
    sys.exit(f"the dynamic nodes of {name} were not powered down within {timeout:.0f}s")


def one_run(name: str, controller: str) -> dict[str, float]:
    """One job from powered-down dynamic nodes (``controller``: the static node's container)."""
    _powered_down(controller, name, 400)
    _on(controller, f"cat > /tmp/bench-job.sh <<'EOS'\n{JOB}EOS\nchmod 755 /tmp/bench-job.sh", user="gpuprov")
    start = time.time()
    _on(controller, f"cd /tmp && sbatch --wait -N2 --exclude={name}-node-1 -o /tmp/bench-%j.out /tmp/bench-job.sh",
        user="gpuprov")
    done = time.time()
    started = float(subprocess.run(["docker", "exec", f"gpuprov-{name}-dy-1", "cat", "/tmp/bench-started"],
                                   capture_output=True, text=True, check=True).stdout)
    return {"submit_to_running_s": started - start, "submit_to_done_s": done - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="gpuprov-bench-elastic-")
    env = {**os.environ, "GPUPROV_HOME": home, "GPUPROV_BAKED_REPO": f"gpuprov-bench/elastic-{secrets.token_hex(3)}",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    name = f"bench-ela-{secrets.token_hex(3)}"
    results: dict[str, object] = {"machine": os.uname().nodename, "cpus": os.cpu_count(),
                                  "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        start = time.perf_counter()
        proc = subprocess.run([GPUPROV, "up", "--provider", "docker", "--count", "1", "--name", name, "--scheduler",
                               "slurm", "--max-count", "3", "--idle-minutes", "1", "--tags", "rdma,slurm", "--health",
                               "off", "--no-verify", "--yes"], capture_output=True, text=True, env=env, check=False,
                              stdin=subprocess.DEVNULL)
        results["elastic_up_s"] = figure([time.perf_counter() - start])
        if proc.returncode != 0:
            sys.exit(f"gpuprov up failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        controller = f"gpuprov-{name}-node-1"
        samples: dict[str, list[float]] = {"submit_to_running_s": [], "submit_to_done_s": []}
        for _ in range(args.runs):
            for key, value in one_run(name, controller).items():
                samples[key].append(value)
        for key, values in samples.items():
            results[f"elastic_{key}"] = figure(values)
    finally:
        down(name, env)
        images = subprocess.run(["docker", "image", "ls", env["GPUPROV_BAKED_REPO"], "-q"], capture_output=True,
                                text=True, check=False).stdout.split()
        if images:
            subprocess.run(["docker", "image", "rm", "-f", *set(images)], capture_output=True, check=False)
        report(results)


if __name__ == "__main__":
    main()
