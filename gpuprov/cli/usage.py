"""`gpuprov usage`: who used a Slurm cluster's GPUs, and what it cost."""

from __future__ import annotations

from typing import Any

import click

from gpuprov.cli.options import output_option
from gpuprov.cli.registry import core

BY = ("user", "account", "job")


@click.command(name="usage")
@click.argument("name")
@click.option("--since", metavar="DATE", help="From this date or UTC time (2026-12-01, 2026-12-01T08:00). "
              "Default: 30 days ago, or since the cluster was made.")
@click.option("--until", metavar="DATE", help="Up to this date or UTC time. Default: now.")
@click.option("--by", type=click.Choice(BY), default="user", show_default=True, help="One row per user, "
              "account or job.")
@output_option
def usage_cmd(name: str, since: str | None, until: str | None, by: str, output: str) -> int:
    """GPU-hours, node-hours and cost per user, account or job, from Slurm's accounting.

    Read on the controller (`sacct`, over the pinned SSH connection); each job is priced by the
    nodes it ran on (type, region, on-demand or spot: the price's date and source are shown),
    and the GPU-hours no job held, with their cost, are a row of their own (idle). A cluster
    without prices (local, static) shows the hours and says why it has no cost. The rules:
    docs/slurm.md, "Accounting and usage".

    \b
    gpuprov usage train
    gpuprov usage train --since 2026-12-01 --by account -o json
    """
    data = core("usage").usage(name, since=core("usage").parse_day(since, "--since") if since else None,
                               until=core("usage").parse_day(until, "--until") if until else None, by=by)
    if output == "json":
        from gpuprov.cli.output import emit_json  # lazy: CLI start-up (the result shapes)

        emit_json(data)
    else:
        usage_table(data)
    return 0


def _num(value: float | None) -> str:
    """Hours and dollars as read: two decimals from 1 up, four below (a short job's 0.0083)."""
    if value is None:
        return "-"
    return f"{value:,.2f}" if value >= 1 or value == 0 else f"{value:.4f}"


def usage_table(data: Any) -> None:
    """The rows, the idle row and the total; then each node's price (or why none) and why a
    row's cost is unknown."""
    from gpuprov.cli.table import table  # lazy: CLI start-up (rich)

    rows = [[r.key, r.jobs, _num(r.gpu_hours), _num(r.node_hours), _num(r.usd)] for r in data.rows]
    rows.append(["(idle)", "", _num(data.idle.gpu_hours), "", _num(data.idle.usd)])
    rows.append(["total", sum(r.jobs for r in data.rows), _num(data.total.gpu_hours), "", _num(data.total.usd)])
    table(f"{data.cluster}: usage from {data.since} to {data.until} (sacct on {data.controller})",
          [data.by, "jobs", "GPU-hours", "node-hours", "USD"], rows)
    for node, price in data.prices.items():
        said = f"${price.usd_per_hour}/h, {price.source}" if price.usd_per_hour is not None else \
            f"no price: {price.why}"
        click.echo(f"{node}: {said}")
    for why in sorted({r.why for r in data.rows if r.why}):
        click.echo(f"cost unknown: {why}")
