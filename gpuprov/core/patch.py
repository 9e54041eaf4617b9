"""`gpuprov patch`: rolling driver, kernel and microcode updates that never break a
working fleet.

The roll, in order:

1. Validate (``BadInput``, nothing touched): what to move, the new lock (the
   resolver's rules), the batch size, the mirror for a ``mirror`` lock.
2. Plan: ``playbooks/patch.yml`` in check mode on every node at once. A node
   with nothing to move is ``unchanged`` and is not drained. ``--check`` stops
   here and prints the plan.
3. Baseline: the probes and health checks on the nodes to patch, against the lock
   they run now.
4. Batch by batch (``--batch N``): drain (through Slurm on a Slurm cluster, waiting
   ``--grace`` for its jobs: gpuprov.slurm.drain; then the drain hook), ``patch.yml`` on
   the batch (the kernel guard and the reboot decision are in the playbook), the probes
   against the new lock, the health checks (``--health``, gpuprov.core.health_gate),
   resume hook, Slurm resume. A node whose play fails, whose probes or health checks fail
   where they did not fail before the patch, or whose checks could not run, stops the roll: nodes already done
   stay done, the failing node is reported (and stays drained), nodes not yet
   started are not touched.

Every node is checked over SSH once, before the plan: a node that does not answer
is reported once (status ``not-started``, its ``error`` the SSH error), is never
planned, drained or patched, and the roll goes on with the others; the result is
not ok and the stored lock does not move.

5. The cluster's stored lock moves to the new one only when every node has it.
   Each roll leaves a run record (kind ``patch`` / ``patch-check``) in state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.ansible import runner
from gpuprov.ansible.inventory import render
from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import (
    check_reachable,
    cluster_lock,
    expectations,
    load,
    reachable_nodes,
    refresh,
    validate_name,
    version_lock,
)
from gpuprov.console import Console
from gpuprov.core import elastic, health_gate, patch_pull, via_pull
from gpuprov.core.monitoring import monitoring_host
from gpuprov.core.patch_plan import (  # noqa: F401  (the request and plan, re-exported)
    REPORT_TASK,
    Request,
    batches_of,
    host_reports,
    moved_of,
    new_lock,
    patch_vars,
    plan_of,
    regressions,
    request,
    run_hook,
    what_of,
)
from gpuprov.core.provision import run_site
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.health import run as health_run
from gpuprov.health.facts import Expect
from gpuprov.lock.lock_data import LockData
from gpuprov.probes import run as probes_run
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import LockMove, PatchHost, PatchResult, serialise
from gpuprov.settings import playbook_vars
from gpuprov.slurm import scheduler
from gpuprov.slurm.drain import GRACE_S, HELD, OWN, SlurmDrains, slurm_names
from gpuprov.state import NodeRecord, Store


def _settle(hosts: dict[str, dict[str, Any]]) -> None:
    """After a roll that finished: the nodes with nothing to move are unchanged."""
    for state in hosts.values():
        if state.pop("nothing_to_move", False) and state["status"] == "not-started":
            state["status"] = "unchanged"


# -- the roll ---------------------------------------------------------------------------------
@dataclass
class Roll:
    """One `patch` under way: what its steps share. ``hosts`` holds each node's working record
    (status, changed, rebooted, plan, ...), turned into the result's PatchHost at the end."""

    name: str
    req: Request
    old: LockData
    lock: LockData
    extravars: dict[str, Any]
    console: Console
    files: ClusterFiles | None = None  # once the cluster is locked
    run_dir: Path = Path()
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_name: dict[str, NodeRecord] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)
    batches: list[list[str]] = field(default_factory=list)
    ok: bool = False
    health: str = "quick"  # the health gate's level (`--health`), or "off"
    slurm: SlurmDrains | None = None  # a Slurm cluster's drains (gpuprov.slurm.drain)
    # The GPU sharing moves on a Slurm cluster: each patched node stays drained until Slurm's
    # configuration has the new sharing on every node (slurm_follows).
    hold: bool = False
    pull: via_pull.Round | None = None  # `--via pull`: the rounds' context (gpuprov.core.patch_pull.begin)
    rows: dict[str, list[Any]] = field(default_factory=dict)  # pull: the probe rows of the last round

    @property
    def made_files(self) -> ClusterFiles:
        """The cluster's files, once the cluster is locked and refreshed."""
        assert self.files is not None, "the cluster's files are read when it is locked first"
        return self.files

    def say(self, text: str) -> None:
        self.console.say(text)

    def result(self) -> PatchResult:
        notes = self.slurm.notes if self.slurm else {}
        return PatchResult(cluster=self.name, ok=self.ok, batches=self.batches,
                           hosts={h: PatchHost.of({**s, "slurm": notes.get(h)}) for h, s in self.hosts.items()},
                           lock=LockMove(from_=self.old.get("hash"), to=self.lock["hash"]))


def patch(name: str, req: Request, *, console: Any, store: Store | None = None,
          health: str = "quick") -> PatchResult:
    health = health_gate.level(health)
    store = store or Store()
    validate_name(name)
    cluster = load(store, name)
    slurm = scheduler.of(cluster).kind == "slurm"
    if not slurm and (req.force or req.grace is not None):
        raise BadInput(f"--grace and --force go with a cluster that runs Slurm; '{name}' runs none "
                       "(its drains are --drain and --resume)")
    old = version_lock(store, cluster)
    lock = new_lock(old, req)
    roll = Roll(name, req, old, lock, patch_vars(playbook_vars(cluster, lock), req, lock, old), console,
                health=health)
    with cluster_lock(name):
        provider, roll.files, nodes = refresh(store, cluster)
        nodes = reachable_nodes(cluster, nodes)
        if req.via == "pull":
            roll.pull = patch_pull.begin(store, cluster, provider, roll.files, nodes, console)
        new_expect = expectations(provider, nodes, lock)
        render(cluster.name, cluster.provider, nodes, new_expect, roll.files, monitoring_host(cluster.spec))
        kind = "patch-check" if req.check else "patch"
        roll.run_dir = new_run_dir(roll.files, kind)
        run_id = store.start_run(name, kind, str(roll.run_dir))
        roll.hosts = {n.name: {"status": "not-started", "changed": 0, "rebooted": False} for n in nodes}
        try:
            roll.say(f"{name}: patch {what_of(req, lock)} (lock {old.get('hash')} -> {lock['hash']})")
            reach(roll, nodes)
            if roll.by_name:
                todo = plan(roll)
                follows = slurm and sharing_moves(req, old, lock)
                if follows and req.via == "pull":
                    roll.say(f"{name}: the GPU sharing moves: once the roll ends, `gpuprov provision {name} "
                             "--tags slurm --full --via pull` writes it into Slurm's configuration")
                    follows = False
                elif follows and req.check:
                    roll.say(f"{name}: then Slurm's configuration (slurm.conf, gres.conf) on every node takes the "
                             "new GPU sharing; the nodes patched stay drained until it has")
                if not req.check and slurm and (todo or follows):
                    roll.slurm = slurm_drains(roll, cluster, run_id)
                    roll.hold = follows
                    # The probes after a batch find its nodes drained by this roll (not a fault).
                    new_expect = {h: {**e, "slurm_drained_by": OWN} for h, e in new_expect.items()}
                if not req.check:
                    stopped = roll_out(roll, todo, expectations(provider, nodes, old), new_expect)
                    # The lock moves only when every node has it: not with a node left unreachable.
                    roll.ok = not stopped and not roll.down
                    if roll.ok:
                        _store_lock(store, name, old, lock)
                        if lock.get("hash") != old.get("hash"):
                            elastic.image_follows_lock(store, name, provider, roll.made_files, roll.console)
                        if follows:
                            roll.ok = slurm_follows(roll, store, provider, nodes)
                    elif follows and any(s.get("held") for s in roll.hosts.values()):
                        roll.say(f"  the nodes patched stay drained ({HELD}): once the failed node is fixed, the "
                                 "same `gpuprov patch` finishes the roll and resumes them")
            return roll.result()
        finally:
            done = serialise(roll.result())
            store.finish_run(run_id, roll.ok, {
                "batches": done["batches"], "hosts": done["hosts"], "lock": done["lock"],
                "request": {"driver": req.driver if req.move_driver else None,
                            "kernel_module": req.kernel_module, "kernel": req.kernel,
                            "microcode": req.microcode, "cuda": req.cuda, "gpu_sharing": req.gpu_sharing,
                            "batch": req.batch, "check": req.check,
                            "health": roll.health, "via": req.via}})
            roll.say(f"  artifacts: {roll.run_dir}")


def sharing_moves(req: Request, old: LockData, lock: LockData) -> bool:
    """Whether this patch changes how the GPUs are shared (what Slurm's GRES are made of)."""
    return req.gpu_sharing is not None and (old.get("gpu_sharing") or "none") != (lock.get("gpu_sharing") or "none")


def slurm_follows(roll: Roll, store: Store, provider: Any, nodes: list[NodeRecord]) -> bool:
    """After a roll that moved the GPU sharing on a Slurm cluster: slurm.conf and gres.conf
    written from the new lock on every node (the slurm play; a file every node holds the same,
    which no batch can move alone), then each node held for it resumed. False when that play
    fails: the held nodes stay drained, and the next run of the same patch finishes it."""
    assert roll.slurm is not None
    roll.say(f"{roll.name}: Slurm: slurm.conf and gres.conf with the new GPU sharing on every node")
    outcome = run_site(store, load(store, roll.name), provider, roll.made_files, nodes, console=roll.console,
                       tags=["slurm"], slurm_checked=True, say_next=False)
    if not outcome.ok:
        errors = "; ".join(f"{h}: {e}" for h, e in sorted(outcome.errors.items())) or "the slurm play failed"
        roll.say(f"  Slurm's configuration did not take the new GPU sharing ({errors}); the nodes patched stay "
                 f"drained ({HELD}): run the same `gpuprov patch` again once that is fixed")
        return False
    resumed = roll.slurm.resume_held()
    roll.say(f"  Slurm has the new GPU sharing; resumed: {', '.join(resumed) or 'none was held'}")
    return True


def reach(roll: Roll, nodes: list[NodeRecord]) -> None:
    """0. Each node once over SSH: one that does not answer is reported here, once, and is
    never planned, drained or patched; the others are served."""
    reachable, roll.down = check_reachable(roll.made_files, nodes, roll.console)
    for host, why in roll.down.items():
        mark_unreachable(roll.hosts[host], why)
    roll.by_name = {n.name: n for n in reachable}


def slurm_drains(roll: Roll, cluster: Any, run_id: Any) -> SlurmDrains:
    """A Slurm cluster's drains for this roll: its controller (it must answer) and each
    reachable node's Slurm name."""
    controller = scheduler.controller_of(cluster)
    if controller not in roll.by_name:
        raise GpuprovError(f"{roll.name}: the Slurm controller {controller} does not answer: no node can be "
                           "drained through Slurm, so none is patched")
    grace = roll.req.grace if roll.req.grace is not None else GRACE_S
    return SlurmDrains(controller=roll.by_name[controller], files=roll.made_files,
                       names=slurm_names(list(roll.by_name.values()), roll.made_files), run=f"run {run_id}",
                       grace=grace, force=roll.req.force)


def plan(roll: Roll) -> list[str]:
    """1. Check mode on every reachable node at once: each node's plan; the nodes to patch.
    With ``--check`` the roll ends here."""
    hosts = roll.hosts
    if roll.pull is not None:
        planned = patch_pull.plan_round(roll)
        roll.rows = planned.rows  # the baseline: each node's probes against the lock it runs now
    else:
        planned = patch_pull.pushed(runner.run_playbook(
            _playbook(), roll.made_files, list(roll.by_name), _sub(roll.run_dir, "plan"), title=f"plan {roll.name}",
            check=True, extravars=roll.extravars, limit=list(roll.by_name) if roll.down else (),
            console=roll.console.rich))
    reports = planned.reports
    todo = []
    for host in list(roll.by_name):
        stats = planned.hosts.get(host, {})
        hosts[host]["plan"] = moves = plan_of(reports.get(host, {}), roll.lock, roll.req, roll.old)
        if stats.get("unreachable"):
            # Lost between the check and the plan: left out like the others (the progress has
            # said so, in its one line).
            mark_unreachable(hosts[host], planned.errors.get(host, "unreachable").removeprefix("unreachable: "))
            roll.down[host] = hosts[host]["error"]
            continue
        if host in planned.errors or stats.get("failed"):
            hosts[host]["plan_error"] = planned.errors.get(host, "check run failed")
            todo.append(host)
        elif moves or stats.get("changed"):
            todo.append(host)
        else:
            # Nothing to move here; it is "unchanged" once the roll has finished (or in a
            # check): a roll that stops first never reached it.
            hosts[host]["nothing_to_move"] = True
            if roll.req.check:
                hosts[host]["status"] = "unchanged"
        roll.say(f"  {host}: " + ("; ".join(moves) if moves else hosts[host].get("plan_error") or (
            f"{stats.get('changed')} change(s)" if stats.get("changed") else "nothing to move")))
    roll.batches = batches_of(todo, roll.req.batch)
    if roll.req.check:
        roll.ok = not any("plan_error" in state for state in hosts.values())
    return todo


def roll_out(roll: Roll, todo: list[str], old_expect: dict[str, Any], new_expect: dict[str, Any]) -> bool:
    """2. The baseline (the probes and health checks against the lock the nodes run now), then
    3. batch by batch: drain, patch, probe and check, resume. True when a node stopped the roll."""
    baseline = dict(roll.rows) if roll.pull is not None else probes_run.run_probes(
        roll.made_files.inventory, roll.made_files.ansible_cfg, todo, old_expect, _sub(roll.run_dir, "probes-before"),
        console=roll.console.rich) if todo else {}
    well_before = check_health(roll, todo, old_expect, "health-before", "before the patch")
    for number, batch in enumerate(roll.batches, 1):
        roll.say(f"{roll.name}: batch {number}/{len(roll.batches)}: {', '.join(batch)}")
        ready = [host for host in batch if hook(roll, host, "drain")]
        passed = play(roll, number, ready) if ready else []
        try:
            if passed:
                after = roll.rows if roll.pull is not None else probes_run.run_probes(
                    roll.made_files.inventory, roll.made_files.ansible_cfg, passed, new_expect,
                    _sub(roll.run_dir, f"probes-batch-{number}"), console=roll.console.rich)
                well = check_health(roll, passed, new_expect, f"health-batch-{number}", f"after batch {number}")
                for host in passed:
                    judge(roll.hosts[host], regressions(baseline.get(host, []), after.get(host, [])),
                          health_gate.new_failures(well_before.get(host, []), well.get(host, [])))
        except Exception as exc:
            unchecked(roll, batch, passed, exc)
            if not isinstance(exc, GpuprovError):
                raise
        if not all([finish(roll, host) for host in batch]):
            rest = [h for b in roll.batches[number:] for h in b]
            if rest:
                roll.say(f"{roll.name}: roll stopped; not started: {', '.join(rest)}")
            return True
    _settle(roll.hosts)
    return False


def check_health(roll: Roll, hosts: list[str], expect: dict[str, Any], part: str,
                 when: str) -> dict[str, list[Any]]:
    """The health checks (``roll.health``) on ``hosts``, held to ``expect``'s lock (the probes'
    expectations): {node: its rows}; raw readings under the roll's run (nothing else recorded).
    Nothing with ``--health off``."""
    if roll.health == health_gate.OFF or not hosts:
        return {}
    roll.say(f"{roll.name}: health checks ({roll.health}) {when}: {', '.join(hosts)}")
    expected = {h: Expect.of(expect[h], expect[h].get("stack"), f"gpuprov provision {roll.name}") for h in hosts}
    rows = health_run.check_nodes([roll.by_name[h] for h in hosts], expected, roll.made_files, _sub(roll.run_dir, part),
                       roll.console, roll.health)
    return health_gate.by_node(rows)


def unchecked(roll: Roll, batch: list[str], passed: list[str], exc: Exception) -> None:
    """The probes or health checks after a batch's play could not run: each node the play
    changed is failed with the reason (it stays drained, the roll stops), never left as
    not-started; an unexpected error still ends the command, its batch recorded first."""
    why = str(exc) if isinstance(exc, GpuprovError) else f"{type(exc).__name__}: {exc}"
    for host in passed:
        roll.hosts[host].update(status="failed", error=f"not checked after the patch: {why}")
    if not isinstance(exc, GpuprovError):
        for host in batch:
            finish(roll, host)


def judge(state: dict[str, Any], broken: list[str], sick: list[Any]) -> None:
    """A patched node's verdict: failed when a probe or a health check fails that did not fail
    before the patch (the error names each: the probe and its detail, the check, what was
    found and the action), else patched or unchanged."""
    errors = ([f"probes failed after the patch: {'; '.join(broken)}"] if broken else []) + (
        [f"health failed after the patch: {'; '.join(health_gate.line(r) for r in sick)}"] if sick else [])
    if errors:
        state.update(status="failed", error="; ".join(errors))
    else:
        state["status"] = "patched" if state["changed"] else "unchanged"


def play(roll: Roll, number: int, ready: list[str]) -> list[str]:
    """``patch.yml`` on one batch's drained nodes; the nodes whose play went through."""
    if roll.pull is not None:
        played = patch_pull.batch_round(roll, ready)
        roll.rows = played.rows  # each node's probes against the new lock, after its play
    else:
        played = patch_pull.pushed(runner.run_playbook(
            _playbook(), roll.made_files, ready, _sub(roll.run_dir, f"batch-{number}"),
            title=f"patch {roll.name} batch {number}", limit=ready, extravars=roll.extravars,
            console=roll.console.rich))
    reports = played.reports
    passed = []
    for host in ready:
        state, stats, report = roll.hosts[host], played.hosts.get(host, {}), reports.get(host, {})
        state.update(changed=int(stats.get("changed", 0)), rebooted=bool(report.get("rebooted")),
                     moved=moved_of(report))
        if report.get("reboot_skipped"):
            state["reboot_skipped"] = report["reboot_skipped"]
        if host in played.errors or stats.get("failed") or stats.get("unreachable") or not report:
            state.update(status="failed", error=played.errors.get(host, "the patch play failed"))
        else:
            passed.append(host)
    return passed


def hook(roll: Roll, host: str, phase: str) -> bool:
    """The drain or resume hook for one node, when one is given; a failed hook fails the node.
    On a Slurm cluster the node is drained through Slurm first (its jobs waited for)."""
    if phase == "drain" and roll.slurm is not None:
        ok, detail = roll.slurm.drain(host)
        if not ok:
            roll.hosts[host].update(status="failed", error=detail)
            return False
    command = roll.req.drain if phase == "drain" else roll.req.resume
    if not command:
        return True
    ok, detail = run_hook(command, roll.name, roll.by_name[host], phase)
    if not ok:
        roll.hosts[host].update(status="failed", error=detail)
    return ok


def finish(roll: Roll, host: str) -> bool:
    """A batch's node after its probes: resumed when healthy, and one line; False when it
    stops the roll."""
    state = roll.hosts[host]
    if state["status"] != "failed" and roll.req.resume:
        hook(roll, host, "resume")
    if roll.slurm is not None:
        if state["status"] == "failed":
            roll.slurm.failed(host, state["error"])
        elif roll.hold:
            roll.slurm.hold(host)
            state["held"] = True
        else:
            roll.slurm.resume(host)
    if state["status"] == "failed":
        roll.say(f"  {host}: FAILED: {state['error']}")
        return False
    roll.say(f"  {host}: {state['status']}"
             + (f" ({'; '.join(state['moved'])})" if state.get("moved") else "")
             + (" - rebooted" if state["rebooted"] else "")
             + (f" - no reboot: {state['reboot_skipped']}" if state.get("reboot_skipped") else "")
             + (" - held drained until Slurm has the new GPU sharing" if state.get("held") else ""))
    return True


def mark_unreachable(state: dict[str, Any], why: str) -> None:
    """A node the roll could not reach: never started (nothing ran there, it was not
    drained); the reason is its error, and its plan could not be made."""
    detail = f"unreachable: {why}"
    state.update(status="not-started", error=detail, plan=[], plan_error=detail)


def _store_lock(store: Store, name: str, old: LockData, lock: LockData) -> None:
    if lock.get("hash") != old.get("hash"):
        store.set_lock(name, lock)


def _playbook() -> Path:
    return paths.playbooks_dir() / "patch.yml"


def _sub(run_dir: Path, part: str) -> Path:
    path = run_dir / part
    path.mkdir(mode=0o700)
    return path
