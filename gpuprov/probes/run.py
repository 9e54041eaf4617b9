"""Run the probes against a cluster, or this machine: pytest + testinfra in a subprocess.

A subprocess keeps pytest's import state out of the caller and lets
pytest-xdist spread nodes over workers. Outcomes come back as JSON lines
(collect.py), read while the run goes on to show per-node progress.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput, GpuprovError

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
    only: str | None = None,
) -> dict[str, list[dict[str, str]]]:
    """The probes on a cluster's nodes, over its generated inventory (testinfra's ansible
    backend, pytest-xdist over ``probe_workers``); ``only``: a marker expression choosing them."""
    control_dir(ansible_cfg)
    targets = ["--connection=ansible", f"--ansible-inventory={inventory}", f"--hosts={','.join(hosts)}"]
    workers = probe_workers(len(hosts))
    if workers > 1:
        targets += ["-n", str(workers)]
    return _run(targets, hosts, expectations, run_dir, level, console, {"ANSIBLE_CONFIG": str(ansible_cfg)},
                only=only)


def probe_workers(hosts: int, cpus: int | None = None) -> int:
    """pytest-xdist workers for a probe run of ``hosts`` nodes: one per two nodes, at most one
    per CPU of this machine and 8. Each worker is a pytest of its own (its start, testinfra's
    ``ansible-inventory``): on a 2-core machine a probe run of 2 nodes took the same wall time
    on one process or two and half the CPU on one (2.4 against 5.0 CPU-s), one of 4 nodes
    the least wall on two (5.6 to 6.0 s, against 7.2 on four and 7.4 to 7.9 on one)
    (docs/performance-history.md, 2026-12-03)."""
    return max(1, min(hosts // 2, cpus or os.cpu_count() or 1, 8))


def control_dir(ansible_cfg: Path, make: bool = True) -> Path | None:
    """The cluster's directory of multiplexed SSH connections, made (0700) when missing.

    testinfra multiplexes its commands to a node through one master only if the ControlPath
    directory ansible.cfg names already exists (``[persistent_connection] control_path_dir``);
    otherwise each command is a whole SSH connection and sudo (about 0.28 s and 0.13 CPU-s of
    this machine's on the slow kind). Ansible's ssh connection makes the directory, Mitogen's
    does not, and a cluster just launched has none: made here, a probe run costs one key
    exchange per node, not one per command (docs/performance-history.md, 2026-12-03).
    ``make=False``: only the path (`down` removes the directory with the cluster)."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ansible_cfg)
    raw = cfg.get("persistent_connection", "control_path_dir", fallback="")
    if not raw:
        return None
    path = Path(os.path.expanduser(raw))
    if make:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def run_local_probes(
    expectations: Mapping[str, Mapping[str, Any]],
    run_dir: Path,
    level: str = "quick",
    console: Any | None = None,
    node: str = LOCAL_NODE,
    only: str | None = None,
) -> dict[str, list[dict[str, str]]]:
    """The same probes on this machine, over testinfra's local connection (no SSH, no
    inventory), in this process's environment and with its privileges; results (and
    progress) under ``node`` (the hostname, say), expectations under ``LOCAL_NODE`` or "*".
    ``only``: a marker expression (``check_groups``) choosing the probes."""
    return _run(["--hosts=local://"], [node], expectations, run_dir, level, console, {},
                rename={LOCAL_NODE: node}, only=only)


# The probe groups (pytest.ini's markers) that prove each play of site.yml, by its tag: what a run
# of some plays (`--tags`) is verified by. Every play runs gpuprov_base first, whose GPU facts
# `base` proves; spot and nccl_tests have no probes of their own (`gpuprov health` runs NCCL).
PLAY_GROUPS: dict[str, tuple[str, ...]] = {
    "preflight": ("preflight",),
    "driver": ("driver", "dkms", "fabricmanager", "gpu"),
    "gpu_sharing": ("gpu",),  # the gpu_sharing_matches_the_lock probes are marked gpu
    "cuda": ("cuda", "cudnn"),
    "spot": (),
    "containers": ("containers", "images"),
    "dcgm": ("dcgm",),
    "rdma": ("rdma",),
    "nccl_tests": (),
    "microcode": ("microcode",),
    "slurm": ("slurm",),
}


def groups_of_plays(tags: Sequence[str]) -> str | None:
    """The marker expression of the probes of the plays ``tags`` name (None: every probe, for
    no tags or a tag that is no play's, such as a role's)."""
    if not tags or any(tag not in PLAY_GROUPS for tag in tags):
        return None
    groups = dict.fromkeys(["base", *(g for tag in tags for g in PLAY_GROUPS[tag])])
    return " or ".join(groups)


def probe_groups() -> list[str]:
    """The probes' markers (gpu, driver, cuda, ...), as the probes' pytest.ini declares them."""
    ini = configparser.ConfigParser()
    ini.read(paths.probes_dir() / "pytest.ini")
    lines = ini.get("pytest", "markers", fallback="").splitlines()
    return sorted(line.split(":", 1)[0].strip() for line in lines if line.strip())


def check_groups(expr: str) -> str:
    """A marker expression over ``probe_groups`` (``gpu``, ``gpu and not containers``,
    ``driver or cuda``), checked here so that a typo is one line and exit 2, not a pytest run
    that selects nothing."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    known = probe_groups()
    pos = 0

    def bad(why: str) -> BadInput:
        return BadInput(f"--only {expr!r}: {why}; probe groups: {', '.join(known)} "
                        "(combined with and, or, not, parentheses)")

    def operand() -> None:
        nonlocal pos
        if pos < len(tokens) and tokens[pos] == "not":
            pos += 1
            operand()
        elif pos < len(tokens) and tokens[pos] == "(":
            pos += 1
            either()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise bad("unbalanced parentheses")
            pos += 1
        elif pos < len(tokens) and tokens[pos] in known:
            pos += 1
        else:
            raise bad(f"unknown probe group '{tokens[pos]}'" if pos < len(tokens) else "incomplete")

    def either() -> None:
        nonlocal pos
        operand()
        while pos < len(tokens) and tokens[pos] in ("and", "or"):
            pos += 1
            operand()

    either()
    if pos != len(tokens):
        raise bad(f"unexpected '{tokens[pos]}'")
    return " ".join(tokens)


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that end in a newline. The probes' pytest appends to the results
    file while this process reads it: what follows the last newline is a line still being
    written (a read can land between the writer's bytes), read whole at the next poll."""
    return text.split("\n")[:-1]


def _pytest_command(targets: list[str], run_dir: Path, level: str, only: str | None) -> list[str]:
    """The probes' pytest session: gpuprov's collector plugin, the targets, JUnit beside the run,
    the groups ``only`` chooses and, below the full level, no full-level probe."""
    cmd = [sys.executable, "-m", "pytest", str(paths.probes_dir()), "-p", "gpuprov.probes.collect", *targets,
           f"--junitxml={run_dir / 'probes.xml'}", "-q", "-rN"]
    chosen = [f"({check_groups(only)})"] if only else []
    if level != "full":
        chosen.append("not full")
    return cmd + (["-m", " and ".join(chosen)] if chosen else [])


def _run(
    targets: list[str],
    hosts: Sequence[str],
    expectations: Mapping[str, Mapping[str, Any]],
    run_dir: Path,
    level: str,
    console: Any | None,
    extra_env: Mapping[str, str],
    rename: Mapping[str, str] | None = None,
    only: str | None = None,
) -> dict[str, list[dict[str, str]]]:
    rename = rename or {}
    from rich.console import Console

    console = console or Console(stderr=True)
    expect_file = run_dir / "expectations.json"
    expect_file.write_text(json.dumps(expectations, indent=2))
    results_file = run_dir / "probes.jsonl"
    results_file.write_text("")
    log_file = run_dir / "pytest.log"

    cmd = _pytest_command(targets, run_dir, level, only)
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
            lines = complete_lines(results_file.read_text())
            for line in lines[seen:]:
                item = json.loads(line)
                item["host"] = rename.get(item["host"], item["host"])
                if item["host"] in counts:
                    counts[item["host"]][item["status"]] += 1
                    if item["status"] == "fail":
                        console.print(
                            f"  {item['host']}: FAIL {item['probe']}: {item['detail']}", highlight=False,
                            markup=False, emoji=False,  # the node's words, as text
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
