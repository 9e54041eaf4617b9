"""`gpuprov health`'s quick level on the node itself, with no controller: what Slurm's
HealthCheckProgram (roles/slurm/files/gpuprov-slurm-health) runs every interval.

The same modules as `gpuprov health`, nothing rewritten: gather.py's fixed script run here (as
root, by slurmd), its output read into Facts, the quick level's checks (gpuprov.health.QUICK)
held to the node's Expect, the one `gpuprov health NAME` holds it to (written by the slurm role
as JSON: gpuprov.health.node_bundle.expectations). The node gets these modules in a zipapp
that needs only Python's standard library (gpuprov.health.node_bundle), run as
``python3 -I -S node-health.pyz --expect FILE``.

Prints each check as `gpuprov health` does (FAIL/SKIP/PASS, the check's name, what it found
and what to do), or with ``--json`` the rows as `gpuprov health -o json` gives them. Exit
status: 0 every check passed or skipped, 1 one failed, 2 the Expect file could not be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from gpuprov.health import evaluate, gather
from gpuprov.health.facts import Expect, Facts
from gpuprov.results.shapes import HealthCheck, serialise

# How long the gather script may run here. slurmd kills its HealthCheckProgram after 60 s
# (slurm.conf(5), HealthCheckProgram): the script gets less, and what it printed by then is
# judged, with the cut-off reported as a failure of its own.
BUDGET_S = 40

# The Expect's fields as JSON has them, each with the types it may take.
_FIELDS: dict[str, tuple[type, ...]] = {
    "instance_type": (str, type(None)), "gpus": (int, type(None)), "gpu_model": (str, type(None)),
    "nvswitch": (bool, type(None)), "efa_interfaces": (int,), "lock": (dict, type(None)), "provision": (str,),
}


def expect_data(expect: Expect) -> dict[str, Any]:
    """An Expect as JSON data (what load_expect reads back)."""
    return dataclasses.asdict(expect)


def load_expect(data: Any) -> Expect:
    """The Expect of a JSON object (expect_data's); ValueError naming what is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError("the Expect is a JSON object")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    for name, value in data.items():
        kinds = _FIELDS[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ValueError(f"{name}: {type(value).__name__} is not one of {', '.join(k.__name__ for k in kinds)}")
    return Expect(**data)


def gather_here(expect: Expect, budget_s: int) -> tuple[str, str | None]:
    """The gather script's output run here, and why it was cut off (None: it finished). The
    script runs in its own session, so a cut-off ends every command it started."""
    script = gather.script("quick", expect.nvlink_per_gpu)
    proc = subprocess.Popen(["sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(script, timeout=budget_s)
        return out, None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return out or "", f"not finished within {budget_s} s"


def cut_off(output: str, why: str) -> HealthCheck:
    """The failure a cut-off script adds to the checks' verdicts on what it printed."""
    sections = gather.split(output)
    where = next((name for name, s in sections.items() if s.rc is None), None)
    return HealthCheck(node="", check="gather", status="fail",
                       found=f"the health script was {why}" + (f", in its {where} section" if where else ""),
                       expected="the quick level's readings in seconds",
                       action="drain and reboot the node (a hung nvidia-smi is a GPU that stopped answering); "
                              "RMA if it recurs")


def check(expect: Expect, output: str, why: str | None = None, node: str = "") -> list[HealthCheck]:
    """The quick level's verdicts on one gather output (a cut-off one: ``why``), as `gpuprov
    health` gives them for the node."""
    rows = evaluate(node, Facts(gather.split(output)), expect, "quick")
    return rows + ([dataclasses.replace(cut_off(output, why), node=node)] if why else [])


def line(row: HealthCheck) -> str:
    """One row as `gpuprov health` prints a node's rows."""
    if row.status == "fail":
        return f"FAIL {row.check}: {row.found} -> {row.action}"
    if row.status == "skip":
        return f"SKIP {row.check}: {row.reason}"
    return f"PASS {row.check}: {row.found}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="node-health.pyz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--expect", required=True, help="the node's Expect, a JSON file (the slurm role's)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--budget", type=int, default=BUDGET_S, help=f"seconds the script may run ({BUDGET_S})")
    parser.add_argument("--recorded-gather-output", metavar="FILE",
                        help="tests only: judge this recorded output of the gather script instead of running it")
    args = parser.parse_args(argv)
    try:
        with open(args.expect, encoding="utf-8") as fh:
            expect = load_expect(json.load(fh))
    except (OSError, ValueError) as exc:
        print(f"node-health: {args.expect}: {exc}", file=sys.stderr)
        return 2
    node = socket.gethostname().split(".")[0]
    if args.recorded_gather_output:
        with open(args.recorded_gather_output, encoding="utf-8") as fh:
            output, why = fh.read(), None
    else:
        output, why = gather_here(expect, max(1, args.budget))
    rows = check(expect, output, why, node)
    failed = any(r.status == "fail" for r in rows)
    if args.json:
        print(json.dumps({"node": node, "ok": not failed, "checks": serialise(rows)}, ensure_ascii=True))
    else:
        for row in rows:
            print(line(row))
        counts = {s: sum(r.status == s for r in rows) for s in ("pass", "fail", "skip")}
        print(f"{node}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
