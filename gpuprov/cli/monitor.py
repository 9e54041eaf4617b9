"""`gpuprov monitor`: Prometheus and Alertmanager with gpuprov's GPU alert rules on one node of
the cluster, node_exporter on every node (the monitoring role, playbooks/monitoring.yml)."""

from __future__ import annotations

import click

from gpuprov.cli import output as cli_output
from gpuprov.cli.options import output_option
from gpuprov.cli.registry import core
from gpuprov.console import Console


@click.command()
@click.argument("name")
@click.option("--on", "on", metavar="NODE", help="The node that runs Prometheus and Alertmanager (default: the "
              "one recorded by the last run, else the first node).")
@output_option
def monitor(name: str, on: str | None, output: str) -> int:
    """Monitor the cluster: node_exporter on every node, Prometheus and Alertmanager with
    gpuprov's GPU alert rules on one of them (scraping dcgm-exporter on :9400 of GPU nodes).

    \b
    Everything listens on the nodes' cluster addresses or loopback; `status` shows where
    Prometheus answers (and, for remote clusters, the SSH tunnel that reaches it).
    """
    data = core("monitor").monitor(name, on=on, console=Console())
    if output == "json":
        cli_output.emit_json(data)
        return 0 if data.ok else 1
    cli_output.table(f"monitor {name}: {'ok' if data.ok else 'FAILED'}", ["node", "role", "ok", "changed", "failed"],
                     [[h, "prometheus, alertmanager, node_exporter" if h == data.host else "node_exporter",
                       s.ok, s.changed, s.failed + s.unreachable] for h, s in data.hosts.items()])
    for host, error in data.errors.items():
        click.echo(f"{host}: {error}", err=True)
    if data.prometheus:
        click.echo(f"prometheus: {data.prometheus} (on {data.host}); alertmanager: {data.alertmanager}")
    if data.tunnel:
        click.echo(f"from here: {data.tunnel}  # then http://localhost:9090")
    return 0 if data.ok else 1
