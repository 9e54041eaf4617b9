"""`gpuprov health`: are the nodes' GPUs, kernel log and fabric well now (gpuprov.health)?
A cluster NAME (over its pinned SSH, recorded in state), or --local (this machine)."""

from __future__ import annotations

from typing import Any

import click

from gpuprov import defaults
from gpuprov.cli import output as cli_output
from gpuprov.console import Console
from gpuprov.errors import BadInput


@click.command()
@click.argument("name", required=False)
@click.option("--level", default="quick", show_default=True, metavar="quick|standard|full",
              help="quick: seconds per node, fit for a job prolog; standard: minutes (DCGM's diagnostic "
              "level 2, NCCL inside each node); full: DCGM level 3 on each node (up to 30 min), then "
              "all_reduce_perf across all the nodes under mpirun against the type's floor.")
@click.option("--node", "nodes", multiple=True, metavar="N", help="Only this node (repeatable).")
@click.option("--local", is_flag=True, help="Check this machine itself: no state, no SSH (run as root).")
@click.option("--type", "local_type", metavar="TYPE", help="--local: the instance type this machine is.")
@click.option("--gpus", type=click.IntRange(min=0, max=defaults.MAX_NODE_GPUS), metavar="N",
              help="--local, untyped: the GPUs it must show.")
@click.option("--gpu-model", metavar="MODEL", help="--local, with --gpus: their model (H100, A100, ...).")
@click.option("--output", "-o", type=click.Choice(["table", "json", "junit"]), default="table",
              show_default=True, help="Table for people, JSON (one document on stdout), or JUnit XML.")
@click.option("--all", "every", is_flag=True, help="Print every row, each skip too (default: the pass and fail "
              "rows, one line per skip reason; JSON and JUnit hold every row).")
def health(name: str | None, level: str, nodes: tuple[str, ...], local: bool, output: str, every: bool,
           **flags: Any) -> int:
    """Check the nodes' hardware now: GPUs, driver, NVLink, ECC, row remaps, Xid errors,
    clocks, temperature, EFA, memlock. Each failure names the node, the check, what was
    found, what was expected and the action. Exit 1 when a check fails.

    \b
    gpuprov health demo
    gpuprov health --local --type p5.48xlarge -o junit > health.xml
    """
    from gpuprov.health import run  # lazy: CLI start-up

    run.check_level(level)
    if _target(name, local, nodes, flags) is None:
        from gpuprov.probes import localhost  # lazy: CLI start-up

        req = localhost.request(instance_type=flags["local_type"], gpus=flags["gpus"], gpu_model=flags["gpu_model"])
        data = run.local_health(req, console=Console(), level=level)
    else:
        data = run.cluster_health(str(name), console=Console(), level=level, only=nodes)
    if output == "json":
        cli_output.emit_json(data)
    elif output == "junit":
        click.echo(junit(data))
    else:
        cli_output.health_table(data, every=every, again="gpuprov health --local" if local else None)
    return 0 if data.ok else 1


def _target(name: str | None, local: bool, nodes: tuple[str, ...], flags: dict[str, Any]) -> str | None:
    """The cluster to check, or None for --local; BadInput where the flags do not fit."""
    if name and local:
        raise BadInput(f"health takes a cluster NAME or --local, not both ('{name}' and --local)")
    if not name and not local:
        raise BadInput("health needs a cluster NAME, or --local to check this machine")
    if local:
        if nodes:
            raise BadInput("--node: only with a cluster NAME (--local checks this machine)")
        return None
    given = [flag for key, flag in (("local_type", "--type"), ("gpus", "--gpus"), ("gpu_model", "--gpu-model"))
             if flags.get(key) is not None]
    if given:
        raise BadInput(f"{', '.join(given)}: only with --local (a cluster's nodes are held to what `up` "
                       "recorded, with the cluster's lock)")
    return name


def junit(data: Any) -> str:
    """JUnit XML: a test suite per node, a test case per check (failure: found, expected,
    action; skipped: the reason)."""
    from xml.etree import ElementTree as ET

    root = ET.Element("testsuites", name=f"gpuprov health {data.cluster}")
    for node in dict.fromkeys(r.node for r in data.checks):
        rows = [r for r in data.checks if r.node == node]
        suite = ET.SubElement(root, "testsuite", name=node, tests=str(len(rows)),
                              failures=str(sum(r.status == "fail" for r in rows)),
                              skipped=str(sum(r.status == "skip" for r in rows)), timestamp=data.started)
        for r in rows:
            case = ET.SubElement(suite, "testcase", classname=f"health.{data.level}", name=f"{node}.{r.check}")
            if r.status == "fail":
                failure = ET.SubElement(case, "failure", message=f"{r.found}; action: {r.action}")
                failure.text = f"found: {r.found}\nexpected: {r.expected}\naction: {r.action}"
            elif r.status == "skip":
                ET.SubElement(case, "skipped", message=r.reason or "")
            else:
                case.set("status", "pass")
                ET.SubElement(case, "system-out").text = r.found
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
