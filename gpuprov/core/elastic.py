"""Elastic Slurm from the commands' side (`up`/`provision --max-count M --idle-minutes I`): the
request checked against the cluster, the cluster's power service kept running, and the image
its dynamic nodes boot from kept baked for the cluster's lock (docs/slurm.md, "Elastic
clusters").

Order of a run that gives a cluster dynamic nodes: the choice is checked (one line, exit 2,
nothing made) and recorded; the power key is made and the power service started (its URL goes
into the controller's power configuration); the slurm play declares the dynamic nodes; then,
the play done, the image is baked from the template node (gpuprov.slurm.scheduler
.template_node) unless one baked from this cluster for its lock exists. The service reads
which image from the cluster's record at each resume.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuprov.console import Console
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles, Provider
from gpuprov.slurm import elastic, scheduler
from gpuprov.slurm.scheduler_choice import Replacement, Scheduler
from gpuprov.state import ClusterRecord, Store

# Where the service writes what it does (one line each), beside its address file.
LOG = "power.log"
START_WAIT_S = 20.0
STOP_WAIT_S = 10.0
# The record's key for the image dynamic nodes boot from.
IMAGE_OPTION = "slurm_dynamic_image"


def check(chosen: Scheduler, static_count: int, provider: Provider) -> elastic.Elastic | None:
    """The dynamic nodes ``chosen`` asks for, checked against the cluster's static nodes and
    its provider (BadInput, one line, where they cannot be); None where it asks for none."""
    if chosen.max_count is None:
        return None
    if chosen.replace is not None and provider.powers_from_controller:
        # The controller's service would launch the new node; gpuprov's record of the cluster, its
        # pinned host keys and its site run are the operator's side: not built (docs/slurm.md).
        raise BadInput(f"--replace-unhealthy on {provider.name}: not built yet (local nodes only); an unhealthy "
                       "static node stays drained with its reason until `gpuprov patch` or a replacement by hand")
    return elastic.Elastic(count=static_count, max_count=chosen.max_count,
                           idle_minutes=elastic.DEFAULT_IDLE_MINUTES if chosen.idle_minutes is None
                           else chosen.idle_minutes).checked(chosen.kind, provider.powers_nodes, provider.name)


def merged(recorded: Scheduler, given: Scheduler | None, max_count: int | None,
           idle_minutes: int | None, accounting: bool | None = None,
           replace: Replacement | bool | None = None) -> Scheduler | None:
    """The choice a `provision` makes: ``given`` (its --scheduler flags) or the recorded one,
    with --max-count/--idle-minutes, --accounting/--no-accounting and
    --replace-unhealthy/--no-replace-unhealthy (``replace``: the Replacement to record, or False)
    where given (kept as recorded where not); the accounting's node (--slurm-dbd) kept as
    recorded unless given. None where the command changes nothing."""
    if given is None and max_count is None and idle_minutes is None and accounting is None and replace is None:
        return None
    base = given or recorded
    keep = base.kind == "slurm" and recorded.kind == "slurm"
    if accounting is None:
        accounting = recorded.accounting if keep else base.accounting
    # A node given is kept (and checked); the recorded one only while accounting stays on.
    dbd = given.dbd if given is not None and given.dbd is not None else (
        recorded.dbd if keep and accounting else None)
    replacing: Replacement | None
    if replace is None:
        replacing = recorded.replace if keep else base.replace
    else:
        replacing = Replacement() if replace is True else replace or None
    if max_count is None and idle_minutes is None:
        if keep:
            max_count, idle_minutes = recorded.max_count, recorded.idle_minutes
        else:
            max_count, idle_minutes = base.max_count, base.idle_minutes
    else:
        max_count = max_count if max_count is not None else recorded.max_count
        idle_minutes = idle_minutes if idle_minutes is not None else recorded.idle_minutes
    return Scheduler(base.kind, base.controller, base.controller_only, max_count, idle_minutes, accounting, dbd,
                     replacing)


# -- the power service --------------------------------------------------------------------------
def service_state(files: ClusterFiles, name: str) -> dict[str, Any]:
    """What the service's address file says, with whether its process still runs: {url, pid,
    running}; {} where it was never started."""
    try:
        raw = json.loads((files.dir / scheduler.POWER_SERVICE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    pid = raw.get("pid")
    return {"url": raw.get("url"), "pid": pid, "running": isinstance(pid, int) and _is_service(pid, name)}


def _is_service(pid: int, name: str) -> bool:
    """Whether process ``pid`` is this cluster's power service (not a pid reused since)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"power-service" in argv and name.encode() in argv


def ensure_service(cluster: ClusterRecord, files: ClusterFiles, console: Console) -> str:
    """The URL of the cluster's running power service, started (detached, so it serves when
    this command has ended) where it does not run."""
    state = service_state(files, cluster.name)
    if state.get("running") and isinstance(state.get("url"), str):
        return str(state["url"])
    log = files.dir / LOG
    console.say(f"{cluster.name}: starting its power service (dynamic nodes; log {log})")
    with open(log, "ab") as out:
        os.chmod(log, 0o600)
        proc = subprocess.Popen([sys.executable, "-m", "gpuprov", "power-service", cluster.name],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        state = service_state(files, cluster.name)
        if state.get("pid") == proc.pid and state.get("running"):
            console.say(f"{cluster.name}: power service listening on {state['url']} (pid {proc.pid})")
            return str(state["url"])
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    else:
        proc.kill()
    tail = _last_line(log)
    raise GpuprovError(f"{cluster.name}: its power service did not start: {tail or 'no output'}")


def _last_line(log: Path) -> str:
    tail = _tail(log, 1)
    return tail[0] if tail else ""


def _tail(log: Path, count: int) -> list[str]:
    """The last ``count`` lines of the log, each made printable and cut to 300 characters
    (read from its last 64 KiB: a log never read whole)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, log.stat().st_size - 65536))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [printable(line)[:300] for line in lines[-count:]]


def log_tail(files: ClusterFiles, count: int = 5) -> list[str]:
    """The power service's last ``count`` log lines (`status`)."""
    return _tail(files.dir / LOG, count)


def stop_service(files: ClusterFiles, name: str) -> bool:
    """Stop the cluster's power service where it runs (SIGTERM, then SIGKILL); whether one ran."""
    state = service_state(files, name)
    if not state.get("running"):
        return False
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline and _is_service(pid, name):
        time.sleep(0.1)
    if _is_service(pid, name):
        os.kill(pid, signal.SIGKILL)
    return True


# -- protected mode -----------------------------------------------------------------------------
# After this many failed resumes in a row (a node that would not start, or did not register
# within ResumeTimeout) with no dynamic node coming up between them, the service sets the
# partitions of the failing nodes INACTIVE: jobs stay queued instead of each one resuming
# another node that fails the same way (ParallelCluster's "protected mode"; its
# protected_failure_count is 10). GPUPROV_POWER_PROTECT_AFTER (1 to 100) in the environment of
# `up`/`provision` sets it for the service they start. `gpuprov provision NAME` ends it.
PROTECT_AFTER = 3
PROTECTION = "power-protection.json"


def protect_after() -> int:
    raw = os.environ.get("GPUPROV_POWER_PROTECT_AFTER", "")
    if not raw:
        return PROTECT_AFTER
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise BadInput(f"GPUPROV_POWER_PROTECT_AFTER={raw[:20]!r}: a count of failed resumes, from 1 to 100")
    return int(raw)


def protection(files: ClusterFiles) -> dict[str, Any]:
    """The failed resumes in a row and, once protected, the partitions set INACTIVE and why
    ({} where no resume failed since the last node came up, or since `provision` ended it)."""
    try:
        record = json.loads((files.dir / PROTECTION).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    return {
        "failures": int(record.get("failures") or 0),
        "last": printable(str(record.get("last") or ""))[:300],
        "partitions": [p for p in record.get("partitions") or [] if isinstance(p, str)
                       and scheduler.PARTITION_NAME.fullmatch(p)],
        "since": printable(str(record.get("since") or ""))[:40],
    }


def write_protection(files: ClusterFiles, record: dict[str, Any]) -> None:
    path = files.dir / PROTECTION
    if not record:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def end_protection(cluster: ClusterRecord, files: ClusterFiles, console: Console) -> None:
    """`provision` on an elastic cluster: the partitions protected mode set INACTIVE back UP,
    the dynamic nodes a failed resume set DOWN back in service (powered down, ready to resume),
    the count of failures begun again. Said on the console; what Slurm refused is said too."""
    record = protection(files)
    if not record:
        return
    down = [name for name, row in _dynamic_rows(cluster, files).items()
            if row.state.startswith("down") and row.reason.startswith("gpuprov: ")]
    why = scheduler.power_down_force(cluster, files, down) if down else ""
    if record["partitions"]:
        why = why or scheduler.set_partitions(cluster, files, record["partitions"], "UP")
    if why:
        console.say(f"{cluster.name}: protected mode not ended: {why}")
        return
    write_protection(files, {})
    console.say(f"{cluster.name}: protected mode ended" + (
        f": partition(s) {', '.join(record['partitions'])} UP" if record["partitions"] else "")
        + (f", {', '.join(down)} back in service" if down else ""))


def _dynamic_rows(cluster: ClusterRecord, files: ClusterFiles) -> dict[str, Any]:
    status = scheduler.slurm_status(cluster, files, list(cluster.nodes))
    if status is None or status.error:
        return {}
    tag = f"{cluster.name}-{elastic.DYNAMIC_TAG}-"
    return {n: r for n, r in status.nodes.items() if n.startswith(tag)}


# -- the image dynamic nodes boot from ----------------------------------------------------------
def image_of(cluster: ClusterRecord) -> str | None:
    ref = (cluster.spec.get("options") or {}).get(IMAGE_OPTION)
    return ref if isinstance(ref, str) else None


def ensure_image(store: Store, cluster: ClusterRecord, provider: Provider, files: ClusterFiles,
                 console: Console) -> str:
    """The image the cluster's dynamic nodes boot from, for its current lock: the one recorded,
    else the newest baked from this cluster for the lock, else one baked now from the template
    node (saying so); on aws the one its set-up chose (an AMI baked for the lock from a Slurm
    node: gpuprov.slurm.power_aws_bundle.set_up). Recorded in the cluster's options."""
    lock_hash = (cluster.lock or {}).get("hash")
    if not lock_hash:
        raise GpuprovError(f"cluster '{cluster.name}' has no version lock to bake its dynamic nodes' image for")
    recorded = image_of(cluster)
    if provider.powers_from_controller:
        # The image the cluster's set-up gave the controller's service (power_aws_bundle.set_up).
        ref = scheduler.power_on_node_image(files)
        if not ref:
            raise GpuprovError(f"cluster '{cluster.name}' has no image set up for its dynamic nodes")
    else:
        ref = _baked_here(cluster, provider, files, console, lock_hash, recorded)
    if ref != recorded:
        found = store.get_cluster(cluster.name)
        assert found is not None
        store.set_spec(cluster.name, {**found.spec, "options": {**(found.spec.get("options") or {}),
                                                                 IMAGE_OPTION: ref}})
        console.say(f"{cluster.name}: dynamic nodes boot from {ref}")
    return ref


def image_follows_lock(store: Store, name: str, provider: Provider, files: ClusterFiles, console: Console) -> None:
    """After `patch` moved the lock of a cluster with dynamic nodes: the image they boot from,
    for the new lock. Local nodes: baked now from the template node, just patched (the power
    service reads the record at each resume, so the next dynamic node runs the new stack; until
    now it refused the old lock's image and left the node DOWN). AWS: an AMI is baked from a node
    launched for it (`image bake --scheduler slurm`), not here: said, with the command. A bake
    that fails is said, not raised: the roll itself succeeded."""
    cluster = store.get_cluster(name)
    if cluster is None or scheduler.of(cluster).max_count is None:
        return
    lock_hash = (cluster.lock or {}).get("hash")
    if provider.powers_from_controller:
        like = next((n for n in cluster.nodes if n.name == scheduler.template_node(cluster)), None)
        console.say(f"{name}: warning: its dynamic nodes boot {scheduler.power_on_node_image(files) or 'no image'} "
                    f"until an image of lock {lock_hash} is set up: `gpuprov image bake --provider "
                    f"{provider.name} --type {like.instance_type if like else 'TYPE'} --scheduler slurm`, then "
                    f"`gpuprov provision {name}`")
        return
    console.say(f"{name}: the lock moved to {lock_hash}: the dynamic nodes' image follows it")
    try:
        ensure_image(store, cluster, provider, files, console)
    except GpuprovError as exc:
        console.say(f"{name}: warning: no image of lock {lock_hash} for its dynamic nodes ({exc}); a resume is "
                    f"refused (the node set DOWN, saying why) until `gpuprov provision {name}` bakes one")


def _baked_here(cluster: ClusterRecord, provider: Provider, files: ClusterFiles, console: Console,
                lock_hash: str, recorded: str | None) -> str:
    """The newest image baked from this cluster for its lock (the recorded one first), else one
    baked now from its template node (saying so)."""
    ours = [i for i in provider.baked_images(cluster.spec.get("region"))
            if i.lock_hash == lock_hash and str(i.source).startswith(f"{cluster.name}/")]
    chosen = next((i for i in ours if i.ref == recorded), None) or (ours[-1] if ours else None)
    if chosen is None:
        template = scheduler.template_node(cluster)
        node = next(n for n in cluster.nodes if n.name == template)
        console.say(f"{cluster.name}: no image baked from this cluster for lock {lock_hash}: baking one from "
                    f"{template} for its dynamic nodes")
        chosen = provider.bake(cluster, node, files, console.say)
    return str(chosen.ref)


def require_elastic(cluster: ClusterRecord) -> Scheduler:
    chosen = scheduler.of(cluster)
    if chosen.kind != "slurm" or chosen.max_count is None:
        raise BadInput(f"cluster '{cluster.name}' has no dynamic nodes (`gpuprov provision {cluster.name} "
                       "--max-count M` gives it some)")
    return chosen
