"""`up`'s end: the probes once the nodes are bootstrapped and healthy, and the verdict its last
line gives (ready or not, why, and the next command).

A cluster is called ready only when its probes passed: run here (push mode), or by the nodes
on themselves (pull mode, gpuprov.pull.verdicts), or by an earlier run that left the cluster
verified (an `up` again on it). ``--no-verify`` and ``--tags`` end bootstrapped, not ready and
not failed: the verdict names the command that finishes the cluster.
"""

from __future__ import annotations

import dataclasses

from gpuprov.cluster import load
from gpuprov.core.up_steps import Run
from gpuprov.core.verify import verify
from gpuprov.results.shapes import UpResult, Verdict


def finish(run: Run, result: UpResult) -> UpResult:
    """``result`` with its verdict (and the probes' result when they ran here)."""
    boot, name = result.bootstrap, run.name
    if boot is None:  # --no-bootstrap: the lines of the launch said where it stopped
        return result
    nodes = len(result.nodes)
    if not boot.ok:
        failed = sorted(h for h, s in boot.hosts.items() if s.failed or s.unreachable) or sorted(boot.errors)
        return _with(result, False, f"the bootstrap failed ({_named(failed)})",
                     f"gpuprov provision {name}" if nodes else f"gpuprov up --name {name} ...")
    if result.health is not None and not result.health.ok:
        sick = sorted({c.node for c in result.health.checks if c.status == "fail"})
        return _with(result, False, f"a health check failed ({_named(sick)})", f"gpuprov health {name}")
    pulled = boot.pull.verify if boot.pull is not None else None
    if pulled is not None and pulled.fail:
        return _with(result, False, f"{pulled.fail} probe(s) failed on the nodes (run by each node on itself)",
                     f"gpuprov verify {name}")
    if run.tags:
        return _with(result, None, f"bootstrapped with --tags {','.join(run.tags)} only",
                     f"gpuprov provision {name}")
    if load(run.store, name).state == "verified":
        by = "by the nodes themselves" if pulled is not None else "already"
        return _with(result, True, f"{nodes} node(s) verified {by}", f"gpuprov ssh {name}")
    if not run.verify:
        return _with(result, None, "bootstrapped, not verified (--no-verify)", f"gpuprov verify {name}")
    checked = verify(name, console=run.console, store=run.store)
    result = dataclasses.replace(result, verify=checked)
    if not checked.ok:
        bad = sorted(h for h, rows in checked.hosts.items() if not rows or any(r.status == "fail" for r in rows))
        return _with(result, False, f"{checked.summary.fail} probe(s) failed ({_named(bad)})",
                     f"gpuprov verify {name}")
    return _with(result, True, f"{nodes} node(s) verified ({checked.summary.pass_} probes passed)",
                 f"gpuprov ssh {name}")


def _with(result: UpResult, ready: bool | None, why: str, then: str) -> UpResult:
    return dataclasses.replace(result, verdict=Verdict(ready=ready, why=why, next=then))


def _named(nodes: list[str]) -> str:
    return ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "") if nodes else "see above"
