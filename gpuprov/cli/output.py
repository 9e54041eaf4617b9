"""How the CLI prints: JSON for programs, rich tables for people (rich loads on first use).

Every `--output json` goes through ``emit_json`` (gpuprov.results.shapes.serialise: the shapes
of docs/json-output.md); the tables read the same results' attributes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from gpuprov.cli.table import table
from gpuprov.lock.lock_data import LockData
from gpuprov.providers import having

if TYPE_CHECKING:
    from gpuprov.results.shapes import (
        Bootstrap,
        ClusterCost,
        ClusterRow,
        NodeRow,
        PatchResult,
        ProvisionResult,
        Replacement,
        Setting,
        StatusResult,
        UpResult,
        VerifyResult,
        VerifySummary,
    )

NODE_COLUMNS = ["node", "id", "address", "ssh", "state", "zone", "type"]
NODE_KEEP = ("id", "address")  # what a user copies: never cut (cli_table)


def emit_json(data: Any) -> None:
    """One JSON document on stdout: a command's result (a dataclass of gpuprov.results.shapes), or plain
    data (types, stack, inventory)."""
    from gpuprov.results.shapes import serialise  # lazy: CLI start-up

    click.echo(json.dumps(serialise(data), indent=2, sort_keys=False))


def node_rows(nodes: list[NodeRow]) -> list[list[Any]]:
    return [[n.name, n.id, n.address, n.ssh_port, n.state, n.zone, n.instance_type] for n in nodes]


def up_result(result: UpResult, output: str) -> None:
    if output == "json":
        emit_json(result)
    elif not result.dry_run:  # a dry run's plan was said (stderr); it has no nodes to show
        table(f"cluster {result.cluster} ({result.provider})", NODE_COLUMNS, node_rows(result.nodes), keep=NODE_KEEP)
        if result.bootstrap is not None:
            provision_table(result.cluster, result.bootstrap)
        if result.health is not None:
            # The counts, and the failing rows (`gpuprov health NAME` shows every row).
            health_table(result.health, failing_only=True)
        if result.verify is not None:  # as `verify` prints it
            verify_table(result.cluster, result.verify)
        replaced_table(f"set aside and replaced ({result.cluster})", result.replaced or [])
    if result.verdict is not None:  # the run's last line, after its tables (stderr, as its progress)
        v = result.verdict
        word = {True: "ready", False: "not ready", None: "not ready yet"}[v.ready]
        click.echo(f"{result.cluster}: {word}: {v.why}; next: `{v.next}`", err=True)


def replaced_table(title: str, rows: list[Replacement]) -> None:
    """Nodes that left the cluster (`up --min-count`, `patch --onto-image`), what took their place."""
    if rows:
        table(title, ["node", "id", "replaced by", "kept", "why", "when"],
              [[r.old, r.old_id, r.new or "(nothing)", "yes" if r.kept else "", r.why, r.when] for r in rows],
              keep=("id",), under=("why",))


def provision_table(cluster: str, data: ProvisionResult | Bootstrap) -> None:
    table(
        f"bootstrap {cluster}: {'ok' if data.ok else 'FAILED'}",
        ["node", "ok", "changed", "failed", "unreachable"],
        [[h, s.ok, s.changed, s.failed, s.unreachable] for h, s in data.hosts.items()],
    )
    # A check run: each task that would change, by name, per node.
    for host, tasks in (getattr(data, "would_change", None) or {}).items():
        click.echo(f"{host}: would change ({len(tasks)}): " + "; ".join(tasks))


def cluster_list(rows: list[ClusterRow]) -> None:
    table(None, ["name", "provider", "nodes", "created", "state", "$/h", "changed"],
          [[r.name, r.provider, r.nodes, r.created, r.state, money(r.price.usd_per_hour if r.price else None),
            changed_text(r.changed_by, r.changed_at)] for r in rows])
    for r in rows:
        if r.price and r.price.why:
            click.echo(f"{r.name}: " + (f"${money(r.price.usd_per_hour)}/h: " if r.price.usd_per_hour
                                        is not None else "no price: ") + r.price.why)


def changed_text(by: str | None, at: str | None) -> str:
    """Who last changed a cluster's record, and when ("" where not recorded)."""
    return f"{by} at {at}" if by else ""


def status(name: str, data: StatusResult) -> None:
    protected = data.slurm.dynamic.protection if data.slurm and data.slurm.dynamic else None
    if protected and protected.partitions:  # first: nothing runs until someone acts
        click.echo(f"PROTECTED MODE since {protected.since}: partition(s) {', '.join(protected.partitions)} "
                   f"INACTIVE after {protected.failures} failed resume(s) in a row (the last: {protected.last}); "
                   f"jobs stay queued; `gpuprov provision {name}` ends it")
    table(
        f"{name} ({data.provider}): {data.state}" + (f" ({data.failed_step} failed)" if data.failed_step else ""),
        NODE_COLUMNS,
        node_rows(data.nodes),
        keep=NODE_KEEP,
    )
    if data.changed_by:
        click.echo(f"last changed by {changed_text(data.changed_by, data.changed_at)}")
    lock = data.stack
    if lock:
        click.echo(
            f"stack [lock {lock['hash']}]: driver {lock['driver']} ({lock['source']}), "
            f"CUDA {lock['cuda']}, cuDNN {lock['cudnn']}"
            + (f", fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else "")
        )
    if data.driver_eol:
        from gpuprov.lock import drivers  # lazy: CLI start-up

        click.echo(drivers.eol_field(lock))
    settings_table(data.settings)
    images_lines(data)
    replaced_table("replaced", data.replaced)
    for k in data.kept:
        click.echo(f"kept: {k.name} ({k.id}, {k.address}) runs outside the node list since {k.when}: {k.why}; "
                   f"`gpuprov down {name}` removes it")
    slurm_lines(data)
    cost_lines(data.cost)
    health_line(name)
    monitoring_line(name)
    table(
        "recent runs",
        ["id", "kind", "started", "ok", "artifacts"],
        [[r.id, r.kind, r.started, {True: "yes", False: "no", None: "running"}[r.ok], r.artifact_dir]
         for r in data.runs],
        keep=("artifacts",), under=("artifacts",),
    )


def cost_lines(cost: ClusterCost | None) -> None:
    """Each node's launch time, price and cost so far, then the cluster's (or why none)."""
    if cost is None:
        return
    if cost.nodes:
        table("cost (list prices: an estimate, not a bill)", ["node", "launched", "kind", "$/h", "so far $", "source"],
              [[r.node, r.launched or "-", r.kind, money(r.usd_per_hour), money(r.usd_so_far),
                r.source or r.why or ""] for r in cost.nodes], under=("source",))
    if cost.usd_per_hour is not None:
        click.echo(f"cost: ${money(cost.usd_per_hour)}/h now, ${money(cost.usd_so_far)} so far")
    else:
        click.echo(f"cost: no price: {cost.why}")


def slurm_lines(data: StatusResult) -> None:
    """Each node's Slurm state and reason (clusters with `--scheduler slurm`)."""
    if data.slurm is None:
        return
    dynamic = data.slurm.dynamic
    if dynamic is not None:
        service = dynamic.service
        click.echo(f"dynamic nodes: up to {dynamic.dynamic} (max-count {dynamic.max_count}), powered down after "
                   f"{dynamic.idle_minutes} idle min, image {dynamic.image or 'not baked yet'}; power service "
                   + (f"{'running' if service.running else 'NOT RUNNING'} on {service.on_node} "
                      "(gpuprov-power-aws.service; its journal's last lines below)" if service.on_node
                      else f"running on {service.url}" if service.running
                      else f"NOT RUNNING (`gpuprov provision {data.cluster}` starts it)"))
        if dynamic.replace_unhealthy:
            click.echo("  static nodes drained by their own health: replaced from that image once their jobs end")
        counted = dynamic.protection
        if counted and not counted.partitions:
            click.echo(f"  failed resumes in a row: {counted.failures} (the last: {counted.last})")
        for line in service.last:
            click.echo(f"  power: {line}")
    if data.slurm.error:
        click.echo(f"slurm (controller {data.slurm.controller}): unknown: {data.slurm.error}")
        return
    click.echo(f"slurm (controller {data.slurm.controller}): " + "; ".join(
        f"{node} {row.state}" + (f" ({row.reason})" if row.reason else "")
        for node, row in sorted(data.slurm.nodes.items())))


def images_lines(data: StatusResult) -> None:
    """Where the nodes booted from; a node of an image baked for another lock is flagged."""
    if not data.images:
        return
    by_image: dict[str, list[str]] = {}
    for row in data.images:
        by_image.setdefault(row.image, []).append(row.node)
    click.echo("images: " + "; ".join(f"{image} ({len(nodes)} node(s))" for image, nodes in by_image.items()))
    for row in data.images:
        if row.matches_lock is False:
            click.echo(f"gpuprov: warning: {row.node} booted from {row.image}, baked for lock {row.baked_for}, not the "
                       f"cluster's lock {(data.stack or {}).get('hash')}; `gpuprov provision {data.cluster}` "
                       "converges it, or rebuild it from an image of this lock")


def monitoring_line(name: str) -> None:
    """Where the cluster's Prometheus answers, from its last `gpuprov monitor` run (none: nothing)."""
    from gpuprov.state import Store  # lazy: CLI start-up (sqlite3)

    run = next((r for r in Store().runs(name, limit=200) if r.kind == "monitor" and r.ok), None)
    if run is None or not run.summary.get("prometheus"):
        return
    s = run.summary
    click.echo(f"monitoring: prometheus {s['prometheus']} on {s.get('host')}"
               + (f"; from here: {s['tunnel']}" if s.get("tunnel") else ""))


def health_line(name: str) -> None:
    """The cluster's last `gpuprov health` run, in one line (none yet: says so)."""
    from gpuprov.state import Store  # lazy: CLI start-up (sqlite3)

    run = next((r for r in Store().runs(name, limit=200) if r.kind == "health"), None)
    if run is None:
        click.echo(f"health: never checked (`gpuprov health {name}`)")
        return
    s = run.summary
    verdict = {True: "ok", False: "FAILED", None: "running"}[run.ok]
    failed = "; ".join(s.get("failed", [])[:3]) + (" ..." if len(s.get("failed", [])) > 3 else "")
    click.echo(f"health ({s.get('level', '?')}, {run.finished or run.started}): {verdict}, {s.get('pass', 0)} "
               f"pass, {s.get('fail', 0)} fail, {s.get('skip', 0)} skip" + (f"; failing: {failed}" if failed else ""))


def patch_table(name: str, check: bool, data: PatchResult) -> None:
    table(
        f"patch {name}{' (check)' if check else ''}: {'ok' if data.ok else 'STOPPED'}"
        + (f", nodes replaced from {data.image}" if data.image else ", in place"),
        ["node", "status", "changed", "rebooted", "detail"],
        [[h, s.status, s.changed, "yes" if s.rebooted else "no",
          (s.error or (f"replaced by {s.replaced_by}" if s.replaced_by else "; ".join(s.moved or s.plan)))
          + (f" [slurm: {s.slurm}]" if s.slurm else "")]
         for h, s in data.hosts.items()],
    )


def verify_table(name: str, data: VerifyResult, every: bool = False, again: str | None = None) -> None:
    """The PASS and FAIL rows (the FAIL rows last), one line per skip reason, and the counts
    again at the end with the next step. ``every`` (--all): every row, in the nodes' order.
    ``again``: the command that runs it again (default: `gpuprov verify NAME`)."""
    rows = [(host, r) for host, results in data.hosts.items() for r in results]
    s = data.summary
    counts = f"verify {name}: {s.pass_} pass, {s.fail} fail, {s.skip} skip"
    shown = rows if every else shown_rows(rows, lambda row: row[1].status)
    table(counts, ["node", "probe", "status", "detail"], [[h, r.probe, r.status.upper(), r.detail] for h, r in shown],
          keep=("probe",), under=("detail",))
    if every:
        return
    skip_lines([(h, r.probe, r.detail) for h, r in rows if r.status == "skip"], "probe")
    fix = f" (`gpuprov provision {name}` converges the nodes again)" if again is None else ""
    summary_line(counts, s, f"fix what the FAIL rows name{fix}", again or f"gpuprov verify {name}")


def summary_line(counts: str, s: VerifySummary, fix: str, again: str) -> None:
    """The counts again, after the rows: ok, or FAILED and what to do next."""
    click.echo(counts + (f": FAILED; next: {fix}, then `{again}`" if s.fail else ": ok")
               + (f" (`{again} --all`: every row)" if s.skip else ""))


def shown_rows(rows: list[Any], status: Callable[[Any], str]) -> list[Any]:
    """The rows a table shows by default: those that passed, then those that failed (near the
    counts at the end); skips are counted by reason (skip_lines)."""
    return [r for r in rows if status(r) == "pass"] + [r for r in rows if status(r) == "fail"]


def skip_lines(skips: list[tuple[str, str, str]], noun: str) -> None:
    """One line per skip reason, from (node, probe or check, reason): how many it covers and
    on which nodes (`SKIP 9 probes on 2 nodes (n1, n2): no Slurm on this node`)."""
    by_reason: dict[str, list[tuple[str, str]]] = {}
    for node, what, reason in skips:
        by_reason.setdefault(reason, []).append((node, what))
    for reason, covered in by_reason.items():
        nodes = list(dict.fromkeys(node for node, _ in covered))
        names = list(dict.fromkeys(what for _, what in covered))
        what = names[0] if len(names) == 1 else f"{len(names)} {noun}s"
        where = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes" + (
            f" ({', '.join(nodes)})" if len(nodes) <= SKIP_NODES_NAMED else "")
        click.echo(f"SKIP {what} on {where}: {reason or '(no reason given)'}")


SKIP_NODES_NAMED = 4  # a skip reason names its nodes up to this many, then counts them


def settings_table(recorded: dict[str, Setting] | None) -> None:
    if recorded is None:
        click.echo("settings: not recorded yet (the next `up` records them)")
        return
    table("settings (recorded with the cluster)", ["setting", "value", "from"],
          [[k, v.value, v.from_] for k, v in recorded.items()] or [["(none)", "", ""]], keep=("value",))


def money(value: float | None) -> str:
    """US dollars for a table (gpuprov.pricing.prices.usd), ``-`` for none."""
    from gpuprov.pricing import prices  # lazy: CLI start-up

    return "-" if value is None else prices.usd(value)


def types_table(rows: list[dict[str, Any]], region: str, spot: bool, table_date: str, notes: list[str]) -> None:
    """The types as a table: facts, the price here with its source and date, why each is listed."""
    sources = sorted({f"{r['price']['source']} as of {r['price']['as_of']}" for r in rows if r["price"]})
    kind = "spot, cheapest zone" if spot else "on-demand"
    title = (f"instance types, {kind} prices in {region} (USD; "
             + ("; ".join(sources) if sources else f"bundled table of {table_date}") + "; not a quote)")
    show_why = any(r["why"] for r in rows)
    table(
        title,
        ["type", "gpu", "gpus", "mem/gpu GiB", "arch", "cuda", "vcpus", "efa", "nvswitch", "$/h", "$/GPU-h"]
        + (["zone"] if spot else []) + (["why"] if show_why else []),
        [
            [
                r["instance_type"],
                r["gpu"] or "-",
                r["gpus"],
                r["gpu_memory_gib"],
                r["arch"] or "-",
                " ".join(r["cuda_lines"]) or "-",
                r["vcpus"] or "-",
                r["efa_interfaces"] if r["efa"] else "no",
                "yes" if r["nvswitch"] else "no",
                money(r["price"]["usd_per_hour"] if r["price"] else None),
                money(r["price_per_gpu_hour"]),
            ]
            + ([(r["price"] or {}).get("zone") or "-"] if spot else [])
            + (["; ".join(r["why"])] if show_why else [])
            for r in rows
        ],
        under=("why",),
    )
    if any(r["price"] is None and r["provider"] in having("priced") for r in rows):
        click.echo(f"-: no {kind} price confirmed for {region} (the bundled table leaves out what its public "
                   f"source does not list; `gpuprov types --refresh --region {region}` asks AWS)")
    for note in notes:
        click.echo(note)


def stack_table(instance_type: str, data: dict[str, Any]) -> None:
    rows = [[key, "-" if data[key] is None else data[key]] for key in (
        "instance_type", "gpu", "arch", "source", "driver_branch", "driver_branch_kind", "driver_eol",
        "driver", "kernel_module", "fabricmanager", "cuda", "cudnn", "nccl", "efa_installer", "gpu_sharing",
        "hash")
        if key in data]
    table(f"stack for {instance_type}", ["", "version"], rows)
    for note in data["notes"]:  # sentences: a line each, under the table
        click.echo(f"note: {note}")


def eol_warning(lock: LockData | None) -> None:
    """Say once, on stderr, that a lock's driver branch is past its end of life."""
    from gpuprov.lock import stack  # lazy: CLI start-up

    line = stack.eol_warning(lock)
    if line:
        click.echo(f"gpuprov: warning: {line}", err=True)


def eol_warning_of(name: str) -> None:
    """``eol_warning`` for the lock recorded with cluster ``name`` (none recorded: nothing)."""
    from gpuprov.state import Store  # lazy: CLI start-up (sqlite3)

    record = Store().get_cluster(name)
    eol_warning(record.lock if record is not None else None)


def health_table(data: Any, every: bool = False, failing_only: bool = False, again: str | None = None) -> None:
    """As verify_table: the PASS and FAIL rows, one line per skip reason, the counts again with
    the next step; ``every`` (--all): every row. ``failing_only`` (under `up`): the counts and
    the FAIL rows alone (none failed: the count line alone)."""
    s = data.summary
    counts = f"health {data.cluster} ({data.level}): {s.pass_} pass, {s.fail} fail, {s.skip} skip"
    shown = (data.checks if every else [r for r in data.checks if r.status == "fail"] if failing_only
             else shown_rows(data.checks, lambda r: r.status))
    if not shown:
        click.echo(counts)
        return
    table(counts, ["node", "check", "status", "found", "expected", "action"],
          [[r.node, r.check, r.status.upper(), r.found or r.reason or "", r.expected, r.action] for r in shown],
          keep=("check",), under=("found", "expected", "action"))
    if every or failing_only:
        return
    skip_lines([(r.node, r.check, r.reason or r.found or "") for r in data.checks if r.status == "skip"], "check")
    summary_line(counts, s, "the action of each FAIL row", again or f"gpuprov health {data.cluster}")
