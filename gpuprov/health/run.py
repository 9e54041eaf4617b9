"""Run the health checks: on a cluster's nodes over its pinned-host-key SSH (the same
transport and keys as `verify`'s reachability check, gpuprov.ssh), or on this machine
(--local, as `verify --local` resolves its expectations and lock)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import load, reachable_nodes, refresh, version_lock
from gpuprov.console import Console
from gpuprov.errors import BadInput
from gpuprov.health import LEVELS, cluster_nccl, evaluate, gather
from gpuprov.health.facts import Expect, Facts
from gpuprov.probes import localhost
from gpuprov.probes.localhost import LocalRequest
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import HealthCheck, HealthResult, VerifySummary
from gpuprov.slurm import scheduler
from gpuprov.ssh import check_ssh, node_key, ssh_error_line, ssh_options
from gpuprov.state import NodeRecord, Store, now

KIND = "health"


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise BadInput(f"--level {level}: one of {', '.join(LEVELS)}")
    return level


def _ssh_command(node: NodeRecord, files: ClusterFiles) -> list[str]:
    return ["ssh", "-p", str(node.ssh_port), *ssh_options(files.known_hosts, node_key(node, files.login_key)),
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            # Options end here: nothing after this is read as one, whatever it holds.
            "--", f"{node.user}@{node.address}", gather.REMOTE_COMMAND]


def read_node(node: NodeRecord, files: ClusterFiles, level: str = "quick",
              expect: Expect | None = None) -> tuple[str | None, str]:
    """(the script's output, None) or (None, why the node could not be read)."""
    # The same check as every command's (transient failures tried again, a key mismatch final).
    why = check_ssh(node, node_key(node, files.login_key), files.known_hosts)
    if why is not None:
        return None, why
    try:
        proc = subprocess.run(_ssh_command(node, files), input=_script(level, expect), capture_output=True,
                              text=True, timeout=gather.BUDGET_S[level], check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {gather.BUDGET_S[level]}s"
    if proc.returncode == 255 or gather.MARK not in proc.stdout:
        return None, ssh_error_line(proc.stderr, proc.returncode)
    return proc.stdout, ""


def _script(level: str, expect: Expect | None) -> str:
    return gather.script(level, expect.nvlink_per_gpu if expect is not None else None)


def unreachable(node: str, why: str) -> HealthCheck:
    return HealthCheck(node=node, check="reachable", status="fail", found=f"unreachable: {why}",
                       expected="the node answers SSH with its pinned host key",
                       action="check the node is up (console, BMC, cloud status); reboot it if it does not answer")


def summarise(rows: Sequence[HealthCheck]) -> VerifySummary:
    return VerifySummary(pass_=sum(r.status == "pass" for r in rows), fail=sum(r.status == "fail" for r in rows),
                         skip=sum(r.status == "skip" for r in rows))


def progress(console: Console, node: str, rows: Sequence[HealthCheck], seconds: float) -> None:
    s = summarise(rows)
    console.say(f"  {node}: {s.pass_} pass, {s.fail} fail, {s.skip} skip ({seconds:.1f}s)")
    for r in rows:
        if r.status == "fail":
            console.say(f"    FAIL {r.check}: {r.found} -> {r.action}")


def cluster_health(name: str, *, console: Console, level: str = "quick", only: Sequence[str] = (),
                   store: Store | None = None) -> HealthResult:
    """The checks on every node of ``name`` (``only``: these nodes), in parallel; the run is
    recorded in state (kind ``health``) with its summary and the nodes' raw readings."""
    check_level(level)
    store = store or Store()
    cluster = load(store, name)
    provider, files, nodes = refresh(store, cluster)
    unknown = sorted(set(only) - {n.name for n in nodes})
    if unknown:
        raise BadInput(f"--node {', '.join(unknown)}: not a node of '{name}' (nodes: "
                       f"{', '.join(n.name for n in nodes) or 'none'})")
    nodes = reachable_nodes(cluster, [n for n in nodes if not only or n.name in only])
    lock = version_lock(store, cluster)
    run_dir = new_run_dir(files, KIND)
    started = now()
    run_id = store.start_run(name, KIND, str(run_dir))
    console.say(f"health {name}: {len(nodes)} node(s), level {level}")
    rows: list[HealthCheck] = []
    try:
        expected = {n.name: Expect.of(provider.expectations(n), lock, f"gpuprov provision {name}") for n in nodes}
        readings: dict[str, Facts] = {}
        rows.extend(check_nodes(nodes, expected, files, run_dir, console, level, readings))
        if level == "full":
            launcher = "srun" if scheduler.of(cluster).kind == "slurm" else "mpirun"
            console.say(f"  across {len(nodes)} node(s): all_reduce_perf under {launcher} "
                        f"(budget {cluster_nccl.BUDGET_S} s)")
            row = cluster_nccl.across_nodes(nodes, readings, expected, files, run_dir, launcher)
            progress(console, row.node, [row], 0.0)
            rows.append(row)
    except BaseException:
        # Interrupted or failed part way (SIGTERM, Ctrl-C, an error): the run is recorded as
        # failed, whatever the rows gathered so far said.
        store.finish_run(run_id, False, _stored(_result(name, level, started, rows)))
        raise
    result = _result(name, level, started, rows)
    store.finish_run(run_id, result.ok, _stored(result))
    console.say(f"  raw readings: {run_dir}")
    return result


def check_nodes(nodes: Sequence[NodeRecord], expected: Mapping[str, Expect], files: ClusterFiles,
                run_dir: Path, console: Console, level: str = "quick",
                readings: dict[str, Facts] | None = None) -> list[HealthCheck]:
    """The checks on ``nodes`` in parallel (up to 16 at a time), each held to its ``expected``;
    each node's raw readings kept in ``run_dir`` (and parsed, in ``readings`` when given).
    Records nothing in state (`patch`'s gate keeps them in its own run)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(node: NodeRecord) -> list[HealthCheck]:
        began = time.monotonic()
        out, why = read_node(node, files, level, expected[node.name])
        if out is None:
            found = [unreachable(node.name, why)]
        else:
            (run_dir / f"{node.name}.txt").write_text(out)
            facts = Facts(gather.split(out))
            if readings is not None:
                readings[node.name] = facts
            found = evaluate(node.name, facts, expected[node.name], level)
        progress(console, node.name, found, time.monotonic() - began)
        return found

    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), 16))) as pool:
        return [row for found in pool.map(one, nodes) for row in found]


def _result(cluster: str, level: str, started: str, rows: list[HealthCheck]) -> HealthResult:
    summary = summarise(rows)
    return HealthResult(cluster=cluster, level=level, ok=bool(rows) and summary.fail == 0, started=started,
                        finished=now(), checks=rows, summary=summary)


def _stored(result: HealthResult) -> dict[str, object]:
    """What state keeps of a run (`gpuprov status` shows it): counts and the failures."""
    return {"level": result.level, "pass": result.summary.pass_, "fail": result.summary.fail,
            "skip": result.summary.skip,
            "failed": [f"{r.node}: {r.check} ({r.action})" for r in result.checks if r.status == "fail"]}


def local_health(req: LocalRequest, *, console: Console, level: str = "quick") -> HealthResult:
    """The checks on this machine (no cluster, no SSH, nothing recorded): what it should have
    and its lock as `verify --local` resolves them (gpuprov.probes.localhost.plan)."""
    import os

    check_level(level)
    p = localhost.plan(req)
    if os.geteuid() != 0:
        console.say(f"health --local: not running as root (uid {os.geteuid()}): the kernel log and some "
                    "limits are root's; run it as root for the whole check")
    console.say(f"health --local: {p.node}, expecting {p.expecting}")
    console.say(f"  {localhost.lock_line(p.lock)}")
    started, began = now(), time.monotonic()
    seen = {**p.expectation, "instance_type": req.instance_type}
    expect = Expect.of(seen, p.lock, "gpuprov provision CLUSTER")
    proc = subprocess.run(["sh", "-s"], input=_script(level, expect), capture_output=True, text=True,
                          timeout=gather.BUDGET_S[level], check=False)
    rows = evaluate(p.node, Facts(gather.split(proc.stdout)), expect, level)
    if level == "full":
        rows.append(cluster_nccl.one_node())
    progress(console, p.node, rows, time.monotonic() - began)
    return _result(localhost.LOCAL, level, started, rows)
