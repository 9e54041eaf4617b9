"""`gpuprov power-service NAME`: the host-side power service of a cluster of local nodes with
dynamic Slurm nodes, in the foreground until SIGTERM (`up`/`provision --max-count` start it
detached and `down` stops it: gpuprov.core.elastic; an operator may run it under a service
manager instead).

It listens on the Docker bridge's gateway, where the controller's power program reaches it,
on the port it last used (so the controller's configuration stays right across a restart),
and writes its address and pid to the cluster's power-service.json once listening. Each
request checked (gpuprov.slurm.elastic.verify) is acted on with what the cluster's record says
at that moment: ``resume`` boots each node from the recorded image (baked from this cluster for
its current lock; another lock's image is refused, so a dynamic node never runs an old stack)
and hands it the munge key and the controller's address; ``suspend`` and ``fail`` remove the
node. Each step is one line of the cluster's power.log.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.cluster import files_for, load
from gpuprov.console import Console
from gpuprov.core import elastic as elastic_core
from gpuprov.core import replace_unhealthy
from gpuprov.errors import BadInput, ClusterBusy, GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles
from gpuprov.providers import get as get_provider
from gpuprov.settings import access_keys
from gpuprov.slurm import munge, power_http, scheduler
from gpuprov.slurm.power_rules import orphans, reclaimed, serving, unhealthy
from gpuprov.state import Store

# The log (power.log, the service's output where gpuprov started it) is kept to this size: past
# it, it becomes power.log.1 (the one before is dropped) and a new one is begun.
LOG_MAX_BYTES = 1 << 20
_log: dict[str, Any] = {}


def _say(line: str) -> None:
    print(f"{utc_text()} {printable(line)}", flush=True)
    path = _log.get("path")
    if path is not None:
        rotate(path, LOG_MAX_BYTES)


def rotate(log: Any, limit: int) -> bool:
    """Past ``limit`` bytes, move the log to LOG.1 and go on in a new one, where the service's
    output (fds 1 and 2) is that log file; a service run in a terminal writes no file. Whether
    it rotated."""
    try:
        if os.fstat(1).st_ino != os.stat(log).st_ino or os.stat(log).st_size <= limit:
            return False
    except OSError:
        return False
    os.replace(log, f"{log}.1")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return True


def _previous_port(files: ClusterFiles) -> int:
    url = scheduler.power_url(files) or ""
    tail = url.rsplit(":", 1)[-1].split("/", 1)[0]
    return int(tail) if tail.isdigit() else 0


def serve(name: str, stop: threading.Event | None = None) -> int:
    """Serve cluster ``name``'s power requests until SIGTERM/SIGINT (or ``stop``)."""
    store = Store()
    cluster = load(store, name)
    chosen = elastic_core.require_elastic(cluster)
    provider = get_provider(cluster.provider)
    if not provider.powers_nodes:
        raise BadInput(f"cluster '{name}' is on {provider.name}, whose hosts gpuprov cannot power")
    if provider.powers_from_controller:
        raise BadInput(f"cluster '{name}' is on {provider.name}: its power service runs on its Slurm controller "
                       "(gpuprov-power-aws.service), not here")
    files = files_for(name)
    _log["path"] = files.dir / elastic_core.LOG
    key = munge.ensure_key(files.dir / scheduler.POWER_KEY).read_bytes()
    count = (chosen.max_count or 0) - len(cluster.nodes)
    stop = stop or threading.Event()
    every = reconcile_every()
    limit = elastic_core.protect_after()

    def act(action: str, names: tuple[str, ...]) -> None:
        if action == "fail":  # slurmctld's ResumeTimeout passed: DOWN, with what the node said
            for node_name in names:
                said = provider.power_why(node_name)
                _down(load(Store(), name), files, (node_name,),
                      "did not register within ResumeTimeout" + (f": {said}" if said else ""), limit)
            return
        if action != "resume":
            stuck = provider.power_down(list(names))
            if stuck:
                raise GpuprovError(f"{', '.join(stuck)} would not go")
            return
        now = load(Store(), name)  # the record as it is now: its image, lock and controller
        try:
            image = _image_for(now, provider)
            controller = scheduler.controller_of(now)
            node = next(n for n in now.nodes if n.name == controller)
            for node_name in names:
                provider.power_up(name, node_name, image, node, files.dir / scheduler.MUNGE_KEY, access_keys(now))
                _say(f"resume {node_name}: started from {image}")
        except GpuprovError as exc:
            _down(now, files, names, f"resume failed: {exc}", limit)
            raise

    port = _previous_port(files)
    address = provider.power_address()
    try:
        service = power_http.PowerService(address, name, count, key, act, port=port, log=_say)
    except OSError:  # that port is taken now: another one (the next provision tells the controller)
        service = power_http.PowerService(address, name, count, key, act, log=_say)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with service:
        _write_state(files, {"url": service.url, "pid": os.getpid(), "dynamic": count})
        _say(f"power service of {name}: listening on {service.url} for {count} dynamic node(s)")
        suspects: set[str] = set()
        while not stop.wait(every):
            suspects = _reconcile(name, files, provider, suspects)
    _say(f"power service of {name}: stopped")
    return 0


# How often the service compares the dynamic nodes it runs with what Slurm says of them
# (GPUPROV_POWER_CHECK_S, 5 to 3600, where the environment of `up`/`provision` sets it).
RECONCILE_S = 60.0


def reconcile_every() -> float:
    raw = os.environ.get("GPUPROV_POWER_CHECK_S", "")
    try:
        value = float(raw) if raw else RECONCILE_S
    except ValueError:
        raise BadInput(f"GPUPROV_POWER_CHECK_S={raw[:20]!r}: seconds, from 5 to 3600") from None
    if not 5 <= value <= 3600:
        raise BadInput(f"GPUPROV_POWER_CHECK_S={raw[:20]!r}: seconds, from 5 to 3600")
    return value


def _reconcile(name: str, files: ClusterFiles, provider: Any, suspects: set[str]) -> set[str]:
    """Remove the dynamic nodes that run with no Slurm node behind them (orphans), saying so."""
    try:
        cluster = load(Store(), name)
        running = provider.power_nodes(name)
        replacing = scheduler.of(cluster).replace is not None
        if not running and not replacing:
            return set()
        status = scheduler.slurm_status(cluster, files, list(cluster.nodes))
        if status is None or status.error:
            return suspects  # Slurm did not answer: nothing is judged on no answer
        if replacing:
            _replace_unhealthy(cluster, provider, status.nodes)
        if not running:
            return set()
        _count_again(files, [n for n in running if n in status.nodes and serving(status.nodes[n].state)])
        _power_down_unhealthy(cluster, files, running, status.nodes)
        found, now = orphans(running, {n: r.state for n, r in status.nodes.items()}, suspects)
        for node in found:
            stuck = provider.power_down([node])
            _say(f"orphan {node}: running while Slurm has it " + (status.nodes[node].state if node in status.nodes
                                                                  else "unlisted")
                 + ("; removed" if not stuck else "; would not go"))
        return now - set(found)
    except (GpuprovError, BadInput) as exc:
        _say(f"checking for orphans: {exc}")
        return suspects


def _power_down_unhealthy(cluster: Any, files: ClusterFiles, running: list[str], nodes: dict[str, Any]) -> None:
    """A dynamic node drained by its own health, or by the spot watcher on an interruption notice
    (its jobs requeued), is powered down (a fresh one boots from the image for the next job),
    never left drained holding a slot: said in the log."""
    for node in unhealthy(running, nodes):
        why = scheduler.power_down_force(cluster, files, [node])
        _say(f"unhealthy {node}: drained by its own health ({nodes[node].reason}); "
             + ("powered down" if not why else f"not powered down: {why}"))
    for node in reclaimed(running, nodes):
        why = scheduler.power_down_force(cluster, files, [node])
        _say(f"spot {node}: {nodes[node].reason}, its jobs requeued or ended; "
             + ("powered down" if not why else f"not powered down: {why}"))


# The static nodes whose replacement failed since the service started: not tried again by it (a
# node that fails from the image would fail again); `gpuprov provision` or a restart tries again.
_failed_replacements: set[str] = set()


def _replace_unhealthy(cluster: Any, provider: Any, nodes: dict[str, Any]) -> None:
    """`--replace-unhealthy`: each static node drained by its own health, its jobs ended, replaced
    by a fresh one from the cluster's image (gpuprov.core.replace_unhealthy), said in the log;
    one that fails is set DOWN with why."""
    for node, reason in replace_unhealthy.candidates(cluster, nodes):
        if node in _failed_replacements:
            continue
        _say(f"unhealthy {node}: drained by its own health ({reason}); replacing it")
        try:
            image = _image_for(load(Store(), cluster.name), provider)
            replace_unhealthy.replace(cluster.name, node, reason, image, console=Console(), store=Store())
        except ClusterBusy as exc:
            if any(n.name == node for n in load(Store(), cluster.name).nodes):  # nothing done yet: next check
                _say(f"unhealthy {node}: not replaced yet ({exc}); at the next check")
                continue
            _failed_replacements.add(node)
            _say(f"unhealthy {node}: removed, and its replacement waited in vain: {exc}")
            continue
        except (GpuprovError, BadInput) as exc:
            _failed_replacements.add(node)
            now = load(Store(), cluster.name)
            why = scheduler.mark_down(now, files_for(cluster.name), [node], f"replacement failed: {exc}") \
                if any(n.name != node for n in now.nodes) else "no node left to ask"
            _say(f"unhealthy {node}: replacement failed: {exc}"
                 + ("" if not why else f"; not set DOWN: {why}"))
            continue
        _say(f"unhealthy {node}: replaced from {image}; its drain lifted")


def _count_again(files: ClusterFiles, up: list[str]) -> None:
    """A dynamic node serving: the failed resumes before it are no longer "in a row"."""
    record = elastic_core.protection(files)
    if up and record and not record["partitions"]:
        elastic_core.write_protection(files, {})
        _say(f"{up[0]} is up: the count of failed resumes ({record['failures']}) begins again")


def failed(record: dict[str, Any], nodes: int, reason: str, limit: int) -> tuple[dict[str, Any], bool]:
    """The protection record after ``nodes`` more failed resumes: (the record, whether it now
    reaches ``limit`` for the first time: the partitions are to be set INACTIVE)."""
    count = int(record.get("failures") or 0) + nodes
    new = {"failures": count, "last": reason, "partitions": list(record.get("partitions") or []),
           "since": record.get("since") or ""}
    return new, count >= limit and not new["partitions"]


def _down(cluster: Any, files: ClusterFiles, names: tuple[str, ...], reason: str, limit: int) -> None:
    """A resume that failed: the nodes removed and set DOWN in Slurm with why (Slurm requeues
    their jobs onto nodes that come up), said in the log either way; counted, and at ``limit``
    failures in a row their partitions set INACTIVE (protected mode: jobs wait, queued)."""
    try:
        provider = get_provider(cluster.provider)
        provider.power_down(list(names))
    except GpuprovError as exc:
        _say(f"after a failed resume, removing {', '.join(names)}: {exc}")
    why = scheduler.mark_down(cluster, files, list(names), reason)
    _say(f"{', '.join(names)}: " + (f"set DOWN ({scheduler.reason_text(reason)})" if not why
                                    else f"could not be set DOWN: {why}"))
    record, protect = failed(elastic_core.protection(files), len(names), scheduler.reason_text(reason), limit)
    if protect:
        partitions, why = scheduler.partitions_of(cluster, files, list(names))
        why = why or scheduler.set_partitions(cluster, files, partitions, "INACTIVE")
        if why:
            _say(f"protected mode: {record['failures']} failed resume(s) in a row, but the partitions were "
                 f"not set INACTIVE: {why}")
        else:
            record |= {"partitions": partitions, "since": utc_text()}
            _say(f"protected mode: {record['failures']} failed resume(s) in a row (the last: {record['last']}): "
                 f"partition(s) {', '.join(partitions)} INACTIVE, jobs stay queued; "
                 f"`gpuprov provision {cluster.name}` ends it")
    elastic_core.write_protection(files, record)


def _image_for(cluster: Any, provider: Any) -> str:
    ref = elastic_core.image_of(cluster)
    lock_hash = (cluster.lock or {}).get("hash")
    if not ref:
        raise GpuprovError(f"no image recorded for {cluster.name}'s dynamic nodes yet "
                           f"(`gpuprov provision {cluster.name}` bakes one)")
    found = next((i for i in provider.baked_images(None) if i.ref == ref), None)
    if found is None:
        raise GpuprovError(f"{ref}, the dynamic nodes' image, is gone (`gpuprov provision {cluster.name}` bakes one)")
    if found.lock_hash != lock_hash:
        raise GpuprovError(f"{ref} was baked for lock {found.lock_hash}, the cluster's is {lock_hash} "
                           f"(`gpuprov provision {cluster.name}` bakes one for it)")
    return str(ref)


def _write_state(files: ClusterFiles, state: dict[str, Any]) -> None:
    path = files.dir / scheduler.POWER_SERVICE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
