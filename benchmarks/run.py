#!/usr/bin/env python3
"""gpuprov benchmarks: figures, not pass/fail (`make bench`).

    python benchmarks/run.py [--runs 3] [--startup-runs 15] [--sizes 1,2,4,8] [--scratch-runs 1]
                             [--skip scratch,noop,aws]

On local nodes (the docker provider; the Docker engine, node image and package cache of
`make host-setup`), each figure the median of several runs with min and max:
  - start-up: `gpuprov --help`, `gpuprov list`, `gpuprov status NAME`;
  - up to verified, 2 nodes, from scratch (warm package cache: `up` + `verify`);
  - image bake of one of those nodes;
  - up to verified, 2 nodes, from the baked image;
  - no-op `provision --full` of the whole site (every node runs every play) on 1, 2, 4 and 8
    nodes booted from the baked image, and T(8)/T(1), with Mitogen's strategy (opt-in:
    GPUPROV_ANSIBLE_STRATEGY=mitogen) and, with --strategies mitogen,linear, Ansible's own
    (gpuprov's default) beside it; for each, the CPU it cost (the controller's process tree and
    the node containers' cgroups) and the floor that CPU puts under the wall time on this
    machine's cores: CPU / cores;
  - on the same nodes, the no-op `provision` with manifests (each node checked in one SSH round
    trip, no Ansible where its manifest holds: noop_manifest_*), its CPU, and, from 2 nodes
    up, a `provision` with one node drifted (a managed file edited: that node's full run and
    the others' checks: drift1_*);
  - EC2 calls of `up --type p4d.24xlarge --count 4` against moto (benchmarks/aws_api_calls.py): with
    --image, from the default image (no AMI baked for the lock), and from an AMI baked for it.
Uses its own GPUPROV_HOME and image repository; removes its clusters and image. Writes
bench-results/<time>.json and prints a Markdown table (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bootstrap_scale import node_cpu_s  # noqa: E402  (a sibling script, not a package)


def timed(*args: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([GPUPROV, *args], capture_output=True, text=True, env=env, check=False,
                          stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"gpuprov {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed


def cpu_timed(*args: str, env: dict[str, str], cluster: str) -> tuple[float, float, float]:
    """Wall time, controller CPU (this gpuprov and every process it waited for) and the CPU the
    cluster's node containers used meanwhile (their cgroups), in seconds."""
    before, nodes = resource.getrusage(resource.RUSAGE_CHILDREN), node_cpu_s(cluster)
    wall = timed(*args, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            node_cpu_s(cluster) - nodes)


def figure(samples: list[float], scale: float = 1.0) -> dict[str, float | int]:
    return {"median": round(statistics.median(samples) * scale, 2), "min": round(min(samples) * scale, 2),
            "max": round(max(samples) * scale, 2), "runs": len(samples)}


def down(name: str, env: dict[str, str]) -> None:
    subprocess.run([GPUPROV, "down", name, "--yes"], env=env, capture_output=True, check=False)


def up_verified(name: str, count: int, env: dict[str, str], *extra: str) -> float:
    return timed("up", "--provider", "docker", "--count", str(count), "--name", name, *extra, env=env) + timed(
        "verify", name, env=env)


def _suffix(strategy: str, strategies: list[str]) -> str:
    """Figures of the default strategy keep their names; another one's are marked."""
    return "" if strategy == "mitogen" else f"_{strategy}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (from-scratch: --scratch-runs)")
    parser.add_argument("--startup-runs", type=int, default=15)
    parser.add_argument("--scratch-runs", type=int, default=1, help="from-scratch bootstraps (~15 min each)")
    parser.add_argument("--sizes", default="1,2,4,8", help="node counts of the no-op provision figure")
    parser.add_argument("--strategies", default="mitogen",
                        help="no-op figures per Ansible strategy (GPUPROV_ANSIBLE_STRATEGY), comma-separated: "
                             "mitogen (the default), linear (Ansible's own); runs alternate, same nodes")
    parser.add_argument("--skip", default="", help="comma-separated: scratch, baked (up from the baked image), "
                        "noop, manifest (its no-op and drift figures), aws")
    parser.add_argument("--image", metavar="REF", help="boot from this baked image (of the docker-node lock): "
                        "no from-scratch bootstrap, no bake (those figures are left out)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(n) for n in args.sizes.split(",")]
    strategies = [x for x in args.strategies.split(",") if x]

    home = tempfile.mkdtemp(prefix="gpuprov-bench-")
    tag = secrets.token_hex(3)
    repo = args.image.rsplit(":", 1)[0] if args.image else f"gpuprov-bench/baked-{tag}"
    env = {**os.environ, "GPUPROV_HOME": home, "GPUPROV_BAKED_REPO": repo,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    results: dict[str, object] = {"machine": os.uname().nodename, "cpus": os.cpu_count(),
                                  "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
                                  "git": _git_head(), "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    clusters: list[str] = []
    try:
        timed("--help", env=env)  # warm the page cache once
        results["cli_help_ms"] = figure([timed("--help", env=env) for _ in range(args.startup_runs)], 1000)
        results["cli_list_ms"] = figure([timed("list", env=env) for _ in range(args.startup_runs)], 1000)

        source = f"bench-{tag}"
        clusters.append(source)
        if args.image:
            timed("up", "--provider", "docker", "--count", "1", "--name", source, "--image", args.image,
                  "--health", "off", env=env)
        elif "scratch" not in skip:
            samples = []
            for i in range(args.scratch_runs):
                if i:
                    down(source, env)
                samples.append(up_verified(source, 2, env, "--no-baked"))
            results["up_verified_2_scratch_s"] = figure(samples)
        else:
            timed("up", "--provider", "docker", "--count", "1", "--name", source, "--no-baked", env=env)
        results["cli_status_ms"] = figure([timed("status", source, env=env) for _ in range(args.startup_runs)], 1000)
        if not args.image:
            results["bake_s"] = figure([timed("image", "bake", "--from", source, env=env)])
        down(source, env)

        samples = []
        for i in range(args.runs if "baked" not in skip else 0):
            name = f"bench-{tag}-b{i}"
            clusters.append(name)
            samples.append(up_verified(name, 2, env))
            down(name, env)
        if samples:
            results["up_verified_2_baked_s"] = figure(samples)

        if "noop" not in skip:
            for n in sizes:
                name = f"bench-{tag}-n{n}"
                clusters.append(name)
                timed("up", "--provider", "docker", "--count", str(n), "--name", name, "--health", "off", env=env)
                samples = {x: [] for x in strategies}
                cpu = {x: [] for x in strategies}
                for _ in range(args.runs):  # alternating: both strategies see the same machine state
                    for x in strategies:
                        wall, controller, nodes = cpu_timed("provision", name, "--full", cluster=name,
                                                            env={**env, "GPUPROV_ANSIBLE_STRATEGY": x})
                        samples[x].append(wall)
                        cpu[x].append((controller, nodes))
                for x in strategies:
                    sfx = _suffix(x, strategies)
                    results[f"noop_provision_{n}_s{sfx}"] = figure(samples[x])
                    results[f"noop_provision_{n}_controller_cpu_s{sfx}"] = figure([c for c, _ in cpu[x]])
                    results[f"noop_provision_{n}_node_cpu_s{sfx}"] = figure([d for _, d in cpu[x]])
                    # No schedule beats the CPU the run needs spread over every core of the machine.
                    results[f"noop_provision_{n}_cpu_floor_s{sfx}"] = figure(
                        [(c + d) / os.cpu_count() for c, d in cpu[x]])
                if "manifest" not in skip:
                    results |= manifest_figures(name, n, args.runs, env)
                down(name, env)
            for x in strategies:
                key = f"noop_provision_{{}}_s{_suffix(x, strategies)}"
                first, last = results.get(key.format(sizes[0])), results.get(key.format(sizes[-1]))
                if first and last and len(sizes) > 1:
                    results[f"noop_ratio_T{sizes[-1]}_T{sizes[0]}{_suffix(x, strategies)}"] = round(
                        last["median"] / first["median"], 2)
        if "aws" not in skip:
            for mode in ("image", "default", "baked"):
                out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "aws_api_calls.py"), "--image-from",
                                      mode], capture_output=True, text=True, check=True, cwd=ROOT).stdout
                found = re.search(r"ec2 total: (\d+); mutating: (\d+)", out)
                results[f"aws_up4_ec2_calls_{mode}"] = int(found.group(1)) if found else out
                results[f"aws_up4_ec2_mutating_{mode}"] = int(found.group(2)) if found else None
    finally:
        for name in clusters:
            down(name, env)
        ids = [] if args.image else subprocess.run(["docker", "image", "ls", repo, "-q"], capture_output=True,
                                                   text=True, check=False).stdout.split()
        if ids:
            subprocess.run(["docker", "image", "rm", "-f", *ids], capture_output=True, check=False)
        report(results)  # what was measured, also when a step failed or the run was stopped


# What the drift figure edits on its first node: a file the plays write on every run (the
# unattended-upgrades guard of the driver's packages), so every manifest has it.
DRIFTED_FILE = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"


def _timed_runs(name: str, runs: int, env: dict[str, str], label: str, before=None) -> dict[str, object]:
    """``runs`` timed `provision`s of cluster ``name`` (``before()`` first, each time): wall,
    controller and node CPU, under ``label``."""
    walls, cpus = [], []
    for _ in range(runs):
        if before is not None:
            before()
        wall, controller, nodes = cpu_timed("provision", name, cluster=name, env=env)
        walls.append(wall)
        cpus.append((controller, nodes))
    return {f"{label}_s": figure(walls), f"{label}_controller_cpu_s": figure([c for c, _ in cpus]),
            f"{label}_node_cpu_s": figure([d for _, d in cpus])}


def manifest_figures(name: str, n: int, runs: int, env: dict[str, str]) -> dict[str, object]:
    """The no-op `provision` with manifests on cluster ``name`` (its last `provision --full`
    wrote them), and from 2 nodes up one drifted node's `provision` (the file put back by it)."""
    out = _timed_runs(name, runs, env, f"noop_manifest_{n}")
    if n < 2:
        return out
    first = f"{name}-node-1"

    def drift() -> None:
        container = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={first}"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        subprocess.run(["docker", "exec", container, "sh", "-c", f"echo '// by hand' >> {DRIFTED_FILE}"], check=True)

    out.update(_timed_runs(name, runs, env, f"drift1_of_{n}", drift))
    return out


def report(results: dict[str, object]) -> None:
    out_dir = ROOT / "bench-results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("| figure | median | min | max | runs |\n|---|---|---|---|---|")
    for key, value in results.items():
        if isinstance(value, dict):
            print(f"| {key} | {value['median']} | {value['min']} | {value['max']} | {value['runs']} |")
        else:
            print(f"| {key} | {value} | | | |")
    print(f"(written to {path.relative_to(ROOT)})")


def _git_head() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False)
    return proc.stdout.strip() or "unknown"


if __name__ == "__main__":
    main()
