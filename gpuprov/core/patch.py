"""`gpuprov patch`: rolling driver, kernel and microcode updates that never break a
working fleet.

The roll, in order:

1. Validate (``BadInput``, nothing touched): what to move, the new lock (the
   resolver's rules), the batch size, the mirror for a ``mirror`` lock.
2. Plan: ``playbooks/patch.yml`` in check mode on every node at once. A node
   with nothing to move is ``unchanged`` and is not drained. ``--check`` stops
   here and prints the plan.
3. Baseline: the probes on the nodes to patch, against the lock they run now.
4. Batch by batch (``--batch N``): drain hook, ``patch.yml`` on the batch (the
   kernel guard and the reboot decision are in the playbook), the probes
   against the new lock, resume hook. A node whose play fails, or whose probes
   fail where they passed before the patch, stops the roll: nodes already done
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

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput
from gpuprov.state import NodeRecord, Store

REPORT_TASK = "Report the patch"
HOOK_TIMEOUT = 1800


@dataclass(frozen=True)
class Request:
    """What to move; validated by ``request`` before anything is touched."""

    driver: str | None = None  # target branch or release; None: the lock's branch
    move_driver: bool = False
    kernel: bool = False
    microcode: bool = False
    batch: int = 1
    check: bool = False
    reboot: bool = True
    drain: str | None = None
    resume: str | None = None
    mirror_url: str | None = None
    mirror_key_fingerprint: str | None = None


def _settle(hosts: dict[str, dict[str, Any]]) -> None:
    """After a roll that finished: the nodes with nothing to move are unchanged."""
    for state in hosts.values():
        if state.pop("nothing_to_move", False) and state["status"] == "not-started":
            state["status"] = "unchanged"


def request(*, all_: bool = False, **kw: Any) -> Request:
    """A validated request; ``all_`` moves the driver (to the lock's branch pin unless
    ``driver`` says otherwise), the kernel and microcode."""
    if all_:
        kw.update(kernel=True, microcode=True)
    kw["move_driver"] = bool(kw.get("driver")) or all_
    from gpuprov import validate

    validate.stack_options(kw)
    req = Request(**kw)
    if not (req.move_driver or req.kernel or req.microcode):
        raise BadInput("nothing to patch: give --driver VERSION|BRANCH, --kernel, --microcode or --all")
    if req.batch < 1:
        raise BadInput(f"--batch must be at least 1, not {req.batch}")
    for flag, hook in (("--drain", req.drain), ("--resume", req.resume)):
        if hook is not None and not hook.strip():
            raise BadInput(f"{flag} is empty: give a shell command, or leave the option out")
    return req


def new_lock(lock: dict[str, Any], req: Request) -> dict[str, Any]:
    """The lock after the patch: a new driver through the resolver (fabric manager moves
    with it); microcode pins from the current stack data; everything else as it was."""
    from gpuprov import stack

    fresh = stack.resolve_types(stack.kinds_of(lock), cuda=lock["cuda"],
                                driver=req.driver or lock["driver_branch"], source=lock["source"],
                                label=lock.get("instance_type") or "unknown").as_dict()
    if req.move_driver:
        moved = {k: fresh[k] for k in ("driver_branch", "driver", "fabricmanager")}
        packages = {**lock.get("packages", {}),
                    **{k: fresh["packages"][k] for k in
                       ("driver", "driver_version", "fabricmanager", "fabricmanager_version")}}
        out = {**lock, **moved, "packages": packages}
    else:
        out = dict(lock)
    if req.microcode or "microcode" not in out:
        out["microcode"] = fresh["microcode"]
    body = {k: v for k, v in out.items() if k != "hash"}
    out["hash"] = stack.from_dict(body).short_hash()
    return out


# -- what the playbook reports ------------------------------------------------------------
def host_reports(artifact_dir: Path) -> dict[str, dict[str, Any]]:
    """Each host's ``Report the patch`` message from ansible-runner's job events."""
    out: dict[str, dict[str, Any]] = {}
    events = artifact_dir / "job_events"
    for path in sorted(events.glob("*.json")) if events.is_dir() else ():
        try:
            event = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == REPORT_TASK:
            msg = (data.get("res") or {}).get("msg")
            if isinstance(msg, dict):
                out[data.get("host", "?")] = msg
    return out


def plan_of(report: dict[str, Any], lock: dict[str, Any], req: Request) -> list[str]:
    """What would move on a node, read from its report of the check-mode run."""
    before: dict[str, str] = report.get("before") or {}
    plan = []
    if req.move_driver:
        pattern = lock["packages"]["driver_version"]
        names = list(lock["packages"]["driver"])
        if lock.get("fabricmanager"):
            names.append(lock["packages"]["fabricmanager"])
        for name in names:
            have = before.get(name)
            if have is None or not fnmatch(have, pattern):
                plan.append(f"{name} {have or 'not installed'} -> {pattern}")
    if req.kernel:
        plan += [f"{name} -> newest" for name in report.get("kernel_upgradable") or []]
    if req.microcode:
        vendor = report.get("cpu_vendor")
        package = {"intel": "intel-microcode", "amd": "amd64-microcode"}.get(str(vendor))
        pin = (lock.get("microcode") or {}).get(str(vendor))
        have = before.get(package or "")
        if package and (have is None or (pin and have != pin)):
            plan.append(f"{package} {have or 'not installed'} -> {pin or 'newest'}")
    return plan


def moved_of(report: dict[str, Any]) -> list[str]:
    before: dict[str, str] = report.get("before") or {}
    after: dict[str, str] = report.get("after") or {}
    moved = [f"{k} {before.get(k, 'none')} -> {v}" for k, v in sorted(after.items()) if before.get(k) != v]
    return moved + [f"{k} {v} -> removed" for k, v in sorted(before.items()) if k not in after]


def regressions(before: Sequence[dict[str, str]], after: Sequence[dict[str, str]]) -> list[str]:
    """Probes that fail after the patch but did not fail before it."""
    failed_before = {r["probe"] for r in before if r["status"] == "fail"}
    return [f"{r['probe']}: {r['detail']}" for r in after
            if r["status"] == "fail" and r["probe"] not in failed_before]


def batches_of(names: Sequence[str], size: int) -> list[list[str]]:
    return [list(names[i:i + size]) for i in range(0, len(names), size)]


# -- hooks ------------------------------------------------------------------------------------
def run_hook(command: str, cluster: str, node: NodeRecord, phase: str) -> tuple[bool, str]:
    """A drain or resume hook: a shell command on this machine, told which node it is for."""
    env = {**os.environ, "GPUPROV_CLUSTER": cluster, "GPUPROV_NODE": node.name,
           "GPUPROV_NODE_ADDRESS": node.address, "GPUPROV_HOOK": phase}
    try:
        proc = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True,
                              timeout=HOOK_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"{phase} hook timed out after {HOOK_TIMEOUT}s"
    tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
    return proc.returncode == 0, f"{phase} hook exited {proc.returncode}: {tail[0]}".rstrip(": ")


# -- the roll ---------------------------------------------------------------------------------
def patch(name: str, req: Request, *, console: Any, store: Store | None = None) -> dict[str, Any]:
    from gpuprov import core
    from gpuprov.ansible.inventory import render
    from gpuprov.ansible.runner import new_run_dir, run_playbook
    from gpuprov.core.converge import check_reachable
    from gpuprov.probes.run import run_probes

    store = store or Store()
    core.validate_name(name)
    cluster = core.load(store, name)
    old = core.version_lock(store, cluster)
    lock = new_lock(old, req)
    extravars = core.playbook_vars(cluster, lock)
    if req.move_driver and lock["source"] == "mirror" and not (
            req.mirror_url or extravars["gpuprov_mirror_url"]):
        raise BadInput("this cluster's packages come from a mirror: give --mirror-url and "
                       "--mirror-key-fingerprint for the driver move")
    extravars |= {
        "gpuprov_patch_driver": req.move_driver,
        "gpuprov_patch_kernel": req.kernel,
        "gpuprov_patch_microcode": req.microcode,
        "gpuprov_patch_reboot": req.reboot,
    }
    if req.mirror_url:
        extravars["gpuprov_mirror_url"] = req.mirror_url
        extravars["gpuprov_mirror_key_fingerprint"] = req.mirror_key_fingerprint or ""
    say: Callable[[str], None] = console.say
    playbook = paths.playbooks_dir() / "patch.yml"

    with core.cluster_lock(name):
        provider, files, nodes = core.refresh(store, cluster)
        nodes = core.reachable_nodes(cluster, nodes)
        new_expect = core.expectations(provider, nodes, lock)
        render(cluster.name, cluster.provider, nodes, new_expect, files)
        kind = "patch-check" if req.check else "patch"
        run_dir = new_run_dir(files, kind)
        run_id = store.start_run(name, kind, str(run_dir))
        hosts: dict[str, dict[str, Any]] = {
            n.name: {"status": "not-started", "changed": 0, "rebooted": False} for n in nodes}
        result: dict[str, Any] = {"cluster": name, "ok": False, "batches": [], "hosts": hosts,
                                  "lock": {"from": old.get("hash"), "to": lock["hash"]}}
        try:
            say(f"{name}: patch {_what(req, lock)} (lock {old.get('hash')} -> {lock['hash']})")
            # 0. Each node once over SSH: one that does not answer is reported here, once, and
            # is never planned, drained or patched; the others are served.
            reachable, down = check_reachable(files, nodes, console)
            for host, why in down.items():
                mark_unreachable(hosts[host], why)
            by_name = {n.name: n for n in reachable}
            if not by_name:
                return result
            # 1. Plan: check mode on every reachable node at once.
            planned = run_playbook(playbook, files, list(by_name), _sub(run_dir, "plan"),
                                   title=f"plan {name}", check=True, extravars=extravars,
                                   limit=list(by_name) if down else (), console=console.rich)
            reports = host_reports(planned.artifact_dir)
            todo = []
            for host in by_name:
                stats = planned.hosts.get(host, {})
                plan = plan_of(reports.get(host, {}), lock, req)
                hosts[host]["plan"] = plan
                if stats.get("unreachable"):
                    # Lost between the check and the plan: left out like the others (the
                    # progress has said so, in its one line).
                    mark_unreachable(hosts[host], planned.errors.get(host, "unreachable").removeprefix(
                        "unreachable: "))
                    down[host] = hosts[host]["error"]
                    continue
                if host in planned.errors or stats.get("failed"):
                    hosts[host]["plan_error"] = planned.errors.get(host, "check run failed")
                    todo.append(host)
                elif plan or stats.get("changed"):
                    todo.append(host)
                else:
                    # Nothing to move here; it is "unchanged" once the roll has finished
                    # (or in a check): a roll that stops first never reached it.
                    hosts[host]["nothing_to_move"] = True
                    if req.check:
                        hosts[host]["status"] = "unchanged"
                say(f"  {host}: " + ("; ".join(plan) if plan else
                                     hosts[host].get("plan_error") or
                                     (f"{stats.get('changed')} change(s)" if stats.get("changed") else
                                      "nothing to move")))
            result["batches"] = batches_of(todo, req.batch)
            if req.check:
                result["ok"] = not any("plan_error" in hosts[h] for h in hosts)
                return result
            if not todo:
                _settle(hosts)
                result["ok"] = not down
                if result["ok"]:
                    _store_lock(store, name, old, lock)
                return result
            # 2. Baseline: what the probes say before anything moves (the current lock).
            old_expect = core.expectations(provider, nodes, old)
            baseline = run_probes(files.inventory, files.ansible_cfg, todo, old_expect,
                                  _sub(run_dir, "probes-before"), console=console.rich)
            # 3. The roll.
            stopped = False
            for number, batch in enumerate(result["batches"], 1):
                say(f"{name}: batch {number}/{len(result['batches'])}: {', '.join(batch)}")
                ready = []
                for host in batch:
                    ok, detail = (run_hook(req.drain, name, by_name[host], "drain") if req.drain
                                  else (True, ""))
                    if ok:
                        ready.append(host)
                    else:
                        hosts[host].update(status="failed", error=detail)
                if ready:
                    played = run_playbook(playbook, files, ready, _sub(run_dir, f"batch-{number}"),
                                          title=f"patch {name} batch {number}", limit=ready,
                                          extravars=extravars, console=console.rich)
                    reports = host_reports(played.artifact_dir)
                    passed = []
                    for host in ready:
                        stats, report = played.hosts.get(host, {}), reports.get(host, {})
                        hosts[host].update(changed=int(stats.get("changed", 0)),
                                           rebooted=bool(report.get("rebooted")),
                                           moved=moved_of(report))
                        if report.get("reboot_skipped"):
                            hosts[host]["reboot_skipped"] = report["reboot_skipped"]
                        if host in played.errors or stats.get("failed") or stats.get("unreachable") \
                                or not report:
                            hosts[host].update(status="failed",
                                               error=played.errors.get(host, "the patch play failed"))
                        else:
                            passed.append(host)
                    if passed:
                        after = run_probes(files.inventory, files.ansible_cfg, passed, new_expect,
                                           _sub(run_dir, f"probes-batch-{number}"), console=console.rich)
                        for host in passed:
                            broken = regressions(baseline.get(host, []), after.get(host, []))
                            if broken:
                                hosts[host].update(status="failed",
                                                   error=f"probes failed after the patch: {'; '.join(broken)}")
                            else:
                                hosts[host]["status"] = "patched" if hosts[host]["changed"] else "unchanged"
                for host in batch:
                    if hosts[host]["status"] == "failed":
                        say(f"  {host}: FAILED: {hosts[host]['error']}")
                        stopped = True
                    elif req.resume:
                        ok, detail = run_hook(req.resume, name, by_name[host], "resume")
                        if not ok:
                            hosts[host].update(status="failed", error=detail)
                            say(f"  {host}: FAILED: {detail}")
                            stopped = True
                    if hosts[host]["status"] != "failed":
                        say(f"  {host}: {hosts[host]['status']}"
                            + (f" ({'; '.join(hosts[host]['moved'])})" if hosts[host].get("moved") else "")
                            + (" - rebooted" if hosts[host]["rebooted"] else "")
                            + (f" - no reboot: {hosts[host]['reboot_skipped']}"
                               if hosts[host].get("reboot_skipped") else ""))
                if stopped:
                    rest = [h for b in result["batches"][number:] for h in b]
                    if rest:
                        say(f"{name}: roll stopped; not started: {', '.join(rest)}")
                    break
            if not stopped:
                _settle(hosts)
            # The lock moves only when every node has it: not with a node left unreachable.
            result["ok"] = not stopped and not down
            if result["ok"]:
                _store_lock(store, name, old, lock)
            return result
        finally:
            for state in hosts.values():
                state.pop("nothing_to_move", None)
            store.finish_run(run_id, bool(result["ok"]), {
                "batches": result["batches"], "hosts": hosts, "lock": result["lock"],
                "request": {"driver": req.driver if req.move_driver else None, "kernel": req.kernel, "microcode": req.microcode,
                            "batch": req.batch, "check": req.check}})
            say(f"  artifacts: {run_dir}")


def mark_unreachable(state: dict[str, Any], why: str) -> None:
    """A node the roll could not reach: never started (nothing ran there, it was not
    drained); the reason is its error, and its plan could not be made."""
    detail = f"unreachable: {why}"
    state.update(status="not-started", error=detail, plan=[], plan_error=detail)


def _store_lock(store: Store, name: str, old: dict[str, Any], lock: dict[str, Any]) -> None:
    if lock.get("hash") != old.get("hash"):
        store.set_lock(name, lock)


def _sub(run_dir: Path, part: str) -> Path:
    path = run_dir / part
    path.mkdir(mode=0o700)
    return path


def _what(req: Request, lock: dict[str, Any]) -> str:
    parts = []
    if req.move_driver:
        parts.append(f"driver {lock['driver']}"
                     + (f" + fabric manager {lock['fabricmanager']}" if lock.get("fabricmanager") else ""))
    if req.kernel:
        parts.append("kernel")
    if req.microcode:
        parts.append("microcode")
    return ", ".join(parts) + (" [check]" if req.check else "") + f", batches of {req.batch}"
