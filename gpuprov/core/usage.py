"""`gpuprov usage NAME`: GPU-hours, node-hours and cost per user, account or job, from the Slurm
controller's accounting (`sacct`, over its pinned SSH connection), priced by each node's own price
(gpuprov/slurm/usage.py has the rules; docs/slurm.md, "Accounting and usage")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.cluster import load, refresh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.pricing import cost
from gpuprov.results.costs import UsageResult
from gpuprov.slurm import scheduler
from gpuprov.slurm import usage as rules
from gpuprov.slurm.drain import slurm_names
from gpuprov.state import Store

DEFAULT_DAYS = 30  # the window when --since is not given: the last 30 days, or since the cluster was made


def parse_day(text: str, flag: str) -> datetime:
    """``--since``/``--until``: a date (2026-12-01) or a UTC time (2026-12-01T08:00[:00][Z]);
    anything else is one line, exit 2."""
    try:
        at = datetime.fromisoformat(text.strip().removesuffix("Z"))
    except ValueError:
        raise BadInput(f"{flag} {text[:40]!r}: expected a date (2026-12-01) or a UTC time "
                       "(2026-12-01T08:00:00)") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def usage(name: str, since: datetime | None = None, until: datetime | None = None, by: str = "user",
          store: Store | None = None, now: datetime | None = None) -> UsageResult:
    if by not in rules.BY:
        raise BadInput(f"--by {by}: one of {', '.join(rules.BY)}")
    now = now or datetime.now(UTC)
    until = min(until or now, now)
    store = store or Store()
    cluster = load(store, name)
    if scheduler.of(cluster).kind != "slurm":
        raise BadInput(f"{name}: runs no Slurm; usage reads Slurm's accounting "
                       f"(`gpuprov provision {name} --scheduler slurm`)")
    if not scheduler.of(cluster).accounting:
        raise BadInput(f"{name}: recorded with --no-accounting, so Slurm records no jobs there "
                       f"(`gpuprov provision {name} --accounting` turns it on)")
    if since is None:
        created = cost.parse_utc(cluster.created)
        since = until - timedelta(days=DEFAULT_DAYS)
        since = max(since, created) if created else since
    if since >= until:
        raise BadInput(f"--since {utc_text(since)} is not before --until {utc_text(until)}")
    _, files, nodes = refresh(store, cluster)
    controller, shape, why = scheduler.on_controller(cluster, files, nodes, rules.SINFO_GRES)
    if shape is None:
        raise GpuprovError(f"{name}: {why}")
    _, text, why = scheduler.on_controller(cluster, files, nodes, rules.sacct_argv(since, until))
    if text is None:
        raise GpuprovError(f"{name}: {why} (is Slurm's accounting on? docs/slurm.md, \"Accounting and usage\")")
    facts = node_facts(cluster, nodes, rules.parse_sinfo_gres(shape), slurm_names(nodes, files))
    return UsageResult.of(name, controller, rules.usage(rules.parse_sacct(text), facts, since, until, by))


def node_facts(cluster: Any, nodes: list[Any], shapes: dict[str, tuple[int, int]],
               names: dict[str, str]) -> dict[str, rules.NodeFacts]:
    """Each Slurm node's CPUs and GPUs (Slurm's) with its price (gpuprov's node record: type,
    region, on-demand or spot) or why it has none. A node Slurm knows that is no node record of
    the cluster (a dynamic node, powered up per job) is left out of the idle row and its costs
    are unknown, said so."""
    by_slurm = {slurm: n for n in nodes for node_name, slurm in names.items() if n.name == node_name}
    no_price = cost.why_no_price(cluster.provider)
    out = {}
    for slurm, (cpus, gpus) in shapes.items():
        node = by_slurm.get(slurm)
        if node is None:
            out[slurm] = rules.NodeFacts(cpus, gpus, why=f"{slurm}: a dynamic node (its cost per resume is not "
                                         "counted yet)", always_up=False)
            continue
        price = None if no_price else cost.node_price(node)
        why = no_price or (None if price else f"{slurm}: no price known for {node.instance_type or 'its type'} "
                           "(`gpuprov types --refresh`)")
        out[slurm] = rules.NodeFacts(cpus, gpus, usd_per_hour=price.usd_per_hour if price else None,
                                     source=price.words() if price else None, why=why,
                                     since=cost.launch_time(node))
    return out

