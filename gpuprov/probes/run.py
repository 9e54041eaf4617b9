"""Run the probes against a cluster, or this machine: pytest + testinfra in a subprocess.

A subprocess keeps pytest's import state out of the caller and lets
pytest-xdist spread nodes over workers. Outcomes come back as JSON lines
(collect.py), read while the run goes on to show per-node progress.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.errors import GpuprovError

# The node name testinfra's local connection gives this machine (the `node` fixture).
LOCAL_NODE = "local"


def run_probes(
    inventory: Path,
    ansible_cfg: Path,
    hosts: Sequence[str],
    expectations: Mapping[str, Mapping[str, Any]],
    run_dir: Path,
    level: str = "quick",
    console: Any | None = None,
) -> dict[str, list[dict[str, str]]]:
    """The probes on a cluster's nodes, over its generated inventory (testinfra's ansible
    backend, pytest-xdist over up to 8 workers)."""
    targets = ["--connection=ansible", f"--ansible-inventory={inventory}", f"--hosts={','.join(hosts)}"]
    workers = min(len(hosts), 8)
    if workers > 1:
        targets += ["-n", str(workers)]
    return _run(targets, hosts, expectations, run_dir, level, console, {"ANSIBLE_CONFIG": str(ansible_cfg)})


def run_local_probes(
    expectations: Mapping[str, Mapping[str, Any]],
    run_dir: Path,
    level: str = "quick",
    console: Any | None = None,
    node: str = LOCAL_NODE,
) -> dict[str, list[dict[str, str]]]:
    """The same probes on this machine, over testinfra's local connection (no SSH, no
    inventory), in this process's environment and with its privileges; results (and
    progress) under ``node`` (the hostname, say), expectations under ``LOCAL_NODE`` or "*"."""
    return _run(["--hosts=local://"], [node], expectations, run_dir, level, console, {},
                rename={LOCAL_NODE: node})


def _run(
    targets: list[str],
    hosts: Sequence[str],
    expectations: Mapping[str, Mapping[str, Any]],
    run_dir: Path,
    level: str,
    console: Any | None,
    extra_env: Mapping[str, str],
    rename: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, str]]]:
    rename = rename or {}
    from rich.console import Console

    console = console or Console(stderr=True)
    expect_file = run_dir / "expectations.json"
    expect_file.write_text(json.dumps(expectations, indent=2))
    results_file = run_dir / "probes.jsonl"
    results_file.write_text("")
    log_file = run_dir / "pytest.log"

    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(paths.probes_dir()),
        "-p",
        "gpuprov.probes.collect",
        *targets,
        f"--junitxml={run_dir / 'probes.xml'}",
        "-q",
        "-rN",
    ]
    if level != "full":
        cmd += ["-m", "not full"]
    # A fresh pytest session: nothing of an enclosing pytest or xdist run leaks into it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        {
            "GPUPROV_EXPECTATIONS": str(expect_file),
            "GPUPROV_PROBE_RESULTS": str(results_file),
            **extra_env,
            "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    seen = 0
    counts = {h: {"pass": 0, "fail": 0, "skip": 0} for h in hosts}
    console.print(f"verify: {len(hosts)} node(s), level {level}", highlight=False)
    with log_file.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(run_dir))
        while True:
            done = proc.poll() is not None
            lines = results_file.read_text().splitlines()
            for line in lines[seen:]:
                item = json.loads(line)
                item["host"] = rename.get(item["host"], item["host"])
                if item["host"] in counts:
                    counts[item["host"]][item["status"]] += 1
                    if item["status"] == "fail":
                        console.print(
                            f"  {item['host']}: FAIL {item['probe']}: {item['detail']}", highlight=False
                        )
            seen = len(lines)
            if done:
                break
            time.sleep(0.2)
    results: dict[str, list[dict[str, str]]] = {h: [] for h in hosts}
    for line in results_file.read_text().splitlines():
        item = json.loads(line)
        host = item.pop("host")
        results.setdefault(rename.get(host, host), []).append(item)
    if proc.returncode not in (0, 1) or not any(results.values()):
        tail = " | ".join(log_file.read_text().strip().splitlines()[-3:])
        raise GpuprovError(
            f"the probes did not run (pytest exit {proc.returncode}): {tail} (log: {log_file})"
        )
    for h in hosts:
        results[h].sort(key=lambda r: r["probe"])
        c = counts[h]
        console.print(f"  {h}: {c['pass']} pass, {c['fail']} fail, {c['skip']} skip", highlight=False)
    return results
