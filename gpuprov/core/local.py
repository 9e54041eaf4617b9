"""`gpuprov verify --local`: the probes on this machine itself, with no cluster in gpuprov's
state and no SSH (a DGX administrator, a Slurm prolog, an image bake, a health check).

What the machine should have and its lock: gpuprov.probes.localhost (`health --local` reads
them there too).

Nothing is written to gpuprov's state: a run's files (expectations, JSON lines, JUnit XML,
pytest's log) live in a temporary directory, removed afterwards, and kept (its log named in
the error) only when the probes could not run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from gpuprov.console import Console
from gpuprov.errors import GpuprovError
from gpuprov.lock import drivers
from gpuprov.probes.localhost import LOCAL, LocalRequest, lock_line, plan
from gpuprov.probes.run import run_local_probes
from gpuprov.results.shapes import ProbeRow, VerifyResult, VerifySummary


def verify_local(req: LocalRequest, *, console: Console, level: str = "quick") -> tuple[VerifyResult, str]:
    """Run the probes here; the result (one node: this machine's hostname) and the run's JUnit
    XML (pytest's --junitxml)."""
    p = plan(req)
    if os.geteuid() != 0:
        console.say(f"verify --local: not running as root (uid {os.geteuid()}): probes that read "
                    "root-only files or ask systemd may fail; run it as root for the whole check")
    console.say(f"verify --local: {p.node}, expecting {p.expecting}"
                + (f"; probes: {req.only}" if req.only else ""))
    console.say(f"  {lock_line(p.lock)}")
    eol = drivers.eol_field(p.lock)
    if eol:
        console.say(f"  {eol}")
    run_dir = Path(tempfile.mkdtemp(prefix="gpuprov-verify-local-"))
    try:
        probed = run_local_probes({"*": {**p.expectation, "stack": p.lock}}, run_dir, level=level,
                                  console=console.rich, node=p.node, only=req.only)
    except GpuprovError:
        raise  # the message names the log in run_dir, which stays
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    junit_file = run_dir / "probes.xml"
    junit = junit_file.read_text() if junit_file.exists() else ""
    shutil.rmtree(run_dir, ignore_errors=True)
    rows = [ProbeRow.of(r) for r in probed.get(p.node, [])]
    counts = {s: sum(1 for r in rows if r.status == s) for s in ("pass", "fail", "skip")}
    summary = VerifySummary(pass_=counts["pass"], fail=counts["fail"], skip=counts["skip"])
    result = VerifyResult(cluster=LOCAL, ok=bool(rows) and counts["fail"] == 0, hosts={p.node: rows},
                          summary=summary)
    return result, junit
