"""What a pull run's reports prove: the probes a node must have run (expected_probes), why a
node that reported success has proved nothing (unproven), and the probes the nodes ran on
themselves recorded as `gpuprov verify` records its own (record_probes)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.cluster import phase_at_least
from gpuprov.console import Console
from gpuprov.results.shapes import HostStats, ProbeRow, VerifySummary
from gpuprov.state import Store


def expected_probes(probes_dir: Path | None = None, groups: str | None = None) -> set[str]:
    """The probes a node's quick verification runs (the agent runs them with ``-m "not
    full"``, and ``groups``: the bundle's "probes", groups_of_plays' "base or rdma ...", when the
    plays were some): each probe module's test functions, by the name its rows carry
    (collect.py), read from the probes the bundle carries (this gpuprov's)."""
    import ast
    import re

    wanted = set(groups.split(" or ")) if groups else None

    def marks(exprs: list[ast.expr]) -> set[str]:
        return {m for e in exprs for m in re.findall(r"mark\.(\w+)", ast.unparse(e))}

    names = set()
    for module in sorted((probes_dir or paths.probes_dir()).glob("test_*.py")):
        tree = ast.parse(module.read_text(), str(module))
        own = marks([s.value for s in tree.body if isinstance(s, ast.Assign)
                     and "pytestmark" in ast.unparse(s.targets[0])])
        for f in tree.body:
            if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
                continue
            mine = own | marks(f.decorator_list)
            if "full" not in mine and (wanted is None or mine & wanted):
                names.add(f.name.removeprefix("test_"))
    return names


def unproven(stats: HostStats, got: Mapping[str, Any], expected: set[str]) -> str | None:
    """Why a node that reported success has proved nothing, as push says it
    (gpuprov.ansible.runner): no task ran there, or its probes are not all there."""
    if stats.tasks == 0 and not stats.failed and not stats.unreachable:
        return "no task ran on this node"
    missing = sorted(expected - {str(r.get("probe")) for r in got.get("probes") or ()})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"its report lacks {len(missing)} of the {len(expected)} probes it must run: {shown}"
    return None


def record_probes(store: Store, name: str, names: list[str], outcome: Mapping[str, Mapping[str, Any]],
                   run_dir: Path, console: Console) -> VerifySummary | None:
    """The probes each node ran on itself, recorded as `gpuprov verify` records its own."""
    rows = {n: [ProbeRow.of(r) for r in outcome[n].get("probes") or ()] for n in names}
    if not all(rows.values()):
        return None
    counts = {"pass": 0, "fail": 0, "skip": 0}
    for node, found in rows.items():
        mine = dict.fromkeys(counts, 0)
        for row in sorted(found, key=lambda r: r.probe):
            counts[row.status] += 1
            mine[row.status] += 1
            if row.status == "fail":
                console.say(f"  {node}: FAIL {row.probe}: {row.detail}")
        console.say(f"  {node}: {mine['pass']} pass, {mine['fail']} fail, {mine['skip']} skip (probes run on the node)")
    (run_dir / "probes.json").write_text(json.dumps(
        {n: [dataclasses.asdict(r) for r in found] for n, found in rows.items()}, indent=1) + "\n")
    ok = counts["fail"] == 0
    run_id = store.start_run(name, "verify-quick", str(run_dir))
    store.finish_run(run_id, ok, counts)
    cluster = store.get_cluster(name)
    if ok and cluster is not None and phase_at_least(cluster, "bootstrapped"):
        store.set_cluster_state(name, "verified")
    return VerifySummary(pass_=counts["pass"], fail=counts["fail"], skip=counts["skip"])
