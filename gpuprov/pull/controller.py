"""`up --bootstrap pull` on the controller: build and serve the bundle (or publish it in the
provider's object store: aws's S3 bucket), hand each new node its boot configuration, then
follow the nodes' reports to the same result a push run gives.

The server runs from before the launch (a node fetches its bundle as soon as it boots) until
every node it launched has reported its outcome, or has been silent past its deadline.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuprov import ssh
from gpuprov.ansible import inventory
from gpuprov.ansible.progress import PlaybookProgress
from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import load, version_lock
from gpuprov.console import Console
from gpuprov.errors import GpuprovError
from gpuprov.lock.lock_data import LockData
from gpuprov.manifest import record, remote
from gpuprov.providers import ClusterFiles, ClusterSpec, Plan, Provider
from gpuprov.pull import Boot, verdicts
from gpuprov.pull.bundle import Bundle, build
from gpuprov.pull.objects import ObjectReports
from gpuprov.pull.server import PullServer
from gpuprov.pull.verdicts import expected_probes
from gpuprov.results.shapes import HostStats, ProvisionResult, PullReport, serialise
from gpuprov.settings import playbook_vars
from gpuprov.state import ClusterRecord, NodeRecord, Store

# A node that has not said a word this long after its launch (boot, fetch) has failed, and
# so has one silent this long once it started (the agent reports at least every few seconds
# while Ansible runs: a task that runs longer still writes nothing, so the margin is wide).
FIRST_WORD_S = 900
SILENCE_S = 1200


def play_vars(cluster: ClusterRecord, lock: LockData) -> dict[str, Any]:
    """The bundle's play variables: push's for a cluster without Slurm (gpuprov.core.provision's,
    with gpuprov.slurm.scheduler's ``none``: pull never configures Slurm, refused at launch),
    so that a pulled node's inputs digest is the one the next push `provision` computes."""
    return playbook_vars(cluster, lock) | {"gpuprov_scheduler": "none"}


@dataclass(frozen=True)
class Plays:
    """What a round of pull on nodes that are up runs, when not the site of the cluster's
    stored lock: a patch's rounds (gpuprov.core.patch_pull) run patch.yml with the roll's
    variables, the nodes' probes held to ``lock`` (the plan in check mode: the lock they run
    now). Such a round is recorded as its run only: no manifest, no cluster state, no verify run."""

    lock: LockData
    extravars: Mapping[str, Any]
    playbook: str = "patch.yml"
    check: bool = False


@dataclass
class Session:
    """A pull bootstrap under way: its bundle, the server, the nodes' boot configuration."""

    bundle: Bundle
    server: PullServer | ObjectReports  # ObjectReports through a provider's object store
    boot: Boot
    report: PullReport | None = None


class PullRun(Protocol):
    """What the pull paths read of the run they serve: an `up`'s (gpuprov.core.up_steps.Run) or a
    round on nodes that are up (gpuprov.core.via_pull.Round); ``pull`` is the session under way."""

    pull: Session | None

    @property
    def name(self) -> str: ...
    @property
    def spec(self) -> ClusterSpec: ...
    @property
    def provider(self) -> Provider: ...
    @property
    def store(self) -> Store: ...
    @property
    def console(self) -> Console: ...
    @property
    def made_files(self) -> ClusterFiles: ...
    @property
    def tags(self) -> list[str]: ...


class LaunchRun(PullRun, Protocol):
    """An `up`'s run (gpuprov.core.up_steps.Run): what serving its launch reads and sets."""

    plan: Plan

    @property
    def mode(self) -> str: ...
    @property
    def lock(self) -> LockData: ...
    @property
    def added(self) -> list[NodeRecord]: ...


@contextmanager
def serving(run: LaunchRun) -> Iterator[None]:
    """Around one `up`'s launch and bootstrap (``run``: gpuprov.core.up_steps.Run): in pull mode,
    the bundle built and served, and the plan carrying the nodes' boot configuration."""
    if run.mode != "pull" or not run.provider.pull_at_boot:
        yield  # push; or hosts that exist already (static): served when they are reached
        return
    extravars = play_vars(load(run.store, run.name), run.lock)
    proto = NodeRecord(name="", id="", address="", ssh_port=0, user="", state="",
                       instance_type=run.spec.instance_type or "")
    bundle, profiles = bundle_for(run.provider, run.spec, run.lock, extravars, run.tags, [proto])
    with _served(run, bundle, [], profiles[""], "this launch's nodes") as session:
        run.plan = dataclasses.replace(run.plan, pull=session.boot)
        try:
            yield
        finally:
            run.pull = None


@contextmanager
def _served(run: PullRun, bundle: Bundle, nodes: list[NodeRecord], profile: str, whom: str) -> Iterator[Session]:
    key = secrets.token_bytes(32)
    with PullServer(run.provider.pull_address(run.spec, nodes), key, bundle.data, bundle.sha256, ()) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{bundle.sha256}",
                    report_url=f"{server.base_url}/report", sha256=bundle.sha256, key=key, profile=profile)
        run.console.say(f"  pull: bundle {bundle.sha256[:16]} ({bundle.size / 1e6:.1f} MB, ansible-core "
                        f"{bundle.manifest['ansible_core']}) served on {server.base_url} to {whom}")
        run.pull = Session(bundle=bundle, server=server, boot=boot)
        yield run.pull


def bootstrap(run: LaunchRun, cluster: ClusterRecord, nodes: list[NodeRecord], *,
              push: Callable[..., ProvisionResult]) -> ProvisionResult:
    """The pull bootstrap of the nodes this `up` launched (they pulled at boot); any other node
    that needs one (a cluster resumed after a failed run) is pushed (``push``: the caller's
    site.yml run, gpuprov.core.provision's), and says so. Through a provider's object store
    (aws), every node given pulls: each is handed its configuration over SSH."""
    if run.provider.supports("pull_channel") or run.pull is None:
        return existing(run, cluster, nodes)
    session: Session = run.pull
    added = {n.name for n in run.added}
    pulled = [n for n in nodes if n.name in added]
    others = [n for n in nodes if n.name not in added]
    result, session.report = follow(run.store, run.name, session.server, session.bundle, pulled,
                                    new_run_dir(run.made_files, "bootstrap-pull"), console=run.console, tags=run.tags,
                                    profiles=dict.fromkeys((n.name for n in pulled), session.boot.profile))
    if not others:
        return result
    run.console.say(f"  push: {', '.join(n.name for n in others)} (not launched by this run)")
    pushed = push(run.store, cluster, run.provider, run.made_files, others, console=run.console,
                        tags=run.tags or None)
    return ProvisionResult(cluster=run.name, ok=result.ok and pushed.ok, hosts={**result.hosts, **pushed.hosts},
                           errors={**result.errors, **pushed.errors})


def existing(run: PullRun, cluster: ClusterRecord, nodes: list[NodeRecord], kind: str = "bootstrap-pull", *,
             plays: Plays | None = None, outcome: dict[str, Any] | None = None) -> ProvisionResult:
    """Pull on nodes that are up (hosts that exist, a cluster converged again by `provision --via
    pull`, a patch's round: ``plays``): through the provider's object store (aws: its bucket,
    each round anew), or served from here; each node handed its configuration over SSH. The run
    is recorded as ``kind``; ``outcome`` receives what each node reported (follow's)."""
    through = _through_channel if run.provider.supports("pull_channel") else _existing_hosts
    return through(run, cluster, nodes, kind, plays, {} if outcome is None else outcome)


def _bundle(run: PullRun, cluster: ClusterRecord, nodes: list[NodeRecord],
            plays: Plays | None) -> tuple[Bundle, dict[str, str]]:
    if plays is not None:
        return bundle_for(run.provider, run.spec, plays.lock, plays.extravars, [], nodes,
                          playbook=plays.playbook, check=plays.check)
    lock = version_lock(run.store, load(run.store, run.name))  # as the hosts' buses relocked it
    return bundle_for(run.provider, run.spec, lock, play_vars(cluster, lock), run.tags, nodes)


def _existing_hosts(run: PullRun, cluster: ClusterRecord, nodes: list[NodeRecord], kind: str, plays: Plays | None,
                    outcome: dict[str, Any]) -> ProvisionResult:
    """Pull on hosts gpuprov did not boot: the bundle is built for what their PCI buses
    showed, served, and each host is handed the agent, its unit and its configuration over
    SSH (pinned host key); the agent starts there and the run goes on as at boot."""
    bundle, profiles = _bundle(run, cluster, nodes, plays)
    with _served(run, bundle, nodes, "", f"{len(nodes)} host(s)") as session:
        ssh.each_node(nodes, lambda n: _hand_over(n, run.made_files, session.boot, profiles[n.name]))
        for node in nodes:
            run.console.say(f"  {node.name}: pull agent started over SSH")
        result, session.report = follow(run.store, run.name, session.server, bundle, nodes,
                                        new_run_dir(run.made_files, kind), console=run.console,
                                        tags=run.tags, profiles=profiles, kind=kind, site=plays is None,
                                        outcome=outcome)
    return result


def _through_channel(run: PullRun, cluster: ClusterRecord, nodes: list[NodeRecord], kind: str, plays: Plays | None,
                     outcome: dict[str, Any]) -> ProvisionResult:
    """Pull through the provider's object store (aws: the cluster's S3 bucket): the bundle
    published once under its sha256, each node handed over SSH (pinned host key) its presigned
    GET and its report POST policy, the reports listed and read from the store."""
    bundle, profiles = _bundle(run, cluster, nodes, plays)
    channel = run.provider.pull_channel(run.spec, run.console.say)
    new = channel.publish(bundle.data, bundle.sha256)
    run.console.say(f"  pull: bundle {bundle.sha256[:16]} ({bundle.size / 1e6:.1f} MB, ansible-core "
                    f"{bundle.manifest['ansible_core']}) {'uploaded to' if new else 'already in'} "
                    f"{channel.bucket} for {len(nodes)} node(s)")
    key = secrets.token_bytes(32)
    boot = Boot(bundle_url="", report_url="", sha256=bundle.sha256, key=key, channel=channel)
    reports = ObjectReports(channel, key, [n.name for n in nodes])
    run.pull = Session(bundle=bundle, server=reports, boot=boot)
    ssh.each_node(nodes, lambda n: _hand_over(n, run.made_files, boot, profiles[n.name]))
    run.console.say(f"  pull agent handed over SSH to {len(nodes)} node(s)")
    result, run.pull.report = follow(run.store, run.name, reports, bundle, nodes,
                                     new_run_dir(run.made_files, kind), console=run.console, tags=run.tags,
                                     profiles=profiles, kind=kind, site=plays is None, outcome=outcome)
    channel.remove_reports([n.name for n in nodes])  # recorded in the run's directory now
    return result


# On the host, as root: the archive (Boot.archive: fixed paths) unpacked at /, and the agent's
# unit (re)started without waiting for it. Nothing from a hosts file reaches it but the login.
_HAND_OVER = ("sudo -n sh -c 'tar -x -o -C / -f - && systemctl daemon-reload && "
              "systemctl restart --no-block gpuprov-pull.service'")


def _hand_over(node: NodeRecord, files: ClusterFiles, boot: Boot, profile: str) -> None:
    import subprocess

    proc = subprocess.run(
        ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.login_key)),
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}", _HAND_OVER],
        input=boot.archive(node.name, profile), capture_output=True, check=False, timeout=120)
    if proc.returncode != 0:
        why = ssh.ssh_error_line(proc.stderr.decode(errors="replace"), proc.returncode)
        raise GpuprovError(f"{node.name}: the pull agent could not be handed over ({why})")


def bundle_for(provider: Provider, spec: ClusterSpec, lock: LockData, extravars: Mapping[str, Any],
               tags: list[str], nodes: list[NodeRecord], *, playbook: str = "site.yml",
               check: bool = False) -> tuple[Bundle, dict[str, str]]:
    """The bundle of one cluster's pull bootstrap, and each node's profile in it: the host
    variables and probe expectations of each kind of node (named by their digest)."""
    import hashlib

    profiles: dict[str, dict[str, Any]] = {}
    chosen: dict[str, str] = {}
    for node in nodes:
        expect = {**provider.expectations(node), "stack": dict(lock)}
        hostvars = inventory.host_vars({
            "address": "", "ssh_port": 0, "user": "", "key_file": None, "instance_type": node.instance_type,
            "expected_gpus": expect.get("gpus"), "expected_nvswitch": bool(expect.get("nvswitch")),
            "expected_efa": bool(expect.get("efa")), "root_free_gib": node.extra.get("root_free_gib"),
            "apt_keep_downloads": node.extra.get("apt_keep_downloads"),
        })
        profile = {"hostvars": {k: v for k, v in hostvars.items() if k not in record.CONNECTION_VARS},
                   "expect": expect}
        key = hashlib.sha256(json.dumps(profile, sort_keys=True).encode()).hexdigest()[:12]
        profiles[key], chosen[node.name] = profile, key
    group_vars = inventory.group_vars({"cluster": spec.name, "provider": spec.provider, "known_hosts": ""})
    bundle = build(lock=lock, extravars=extravars, group=inventory.GROUP,
                   group_vars={k: v for k, v in group_vars.items() if k not in record.CONNECTION_VARS},
                   profiles=profiles, tags=tags, playbook=playbook, check=check)
    return bundle, chosen


def follow(store: Store, name: str, server: PullServer | ObjectReports, bundle: Bundle, nodes: list[NodeRecord],
           run_dir: Path, *, console: Console, tags: list[str], profiles: Mapping[str, str] | None = None,
           kind: str = "bootstrap-pull", site: bool = True,
           outcome: dict[str, Any] | None = None) -> tuple[ProvisionResult, PullReport]:
    """Wait for the nodes' reports, showing them as push progress; record the bootstrap and the
    nodes' own probe runs as a bootstrap run and a verify run, and (a run of every play that
    succeeded) each node's manifest as push records it. ``profiles``: each node's profile in
    the bundle (whose inputs digest its manifest is recorded with). ``site`` false (a patch's
    round): the run record alone. ``outcome``: filled with what each node reported."""
    names = [n.name for n in nodes]
    server.add_nodes(names)
    if site and not tags:  # as push: until the run succeeds, the nodes it converges hold no record
        record.write(store, name, dict.fromkeys(names))
    (run_dir / "manifest.json").write_text(json.dumps(bundle.manifest, indent=1) + "\n")
    run_id = store.start_run(name, kind, str(run_dir))
    outcome = {} if outcome is None else outcome
    outcome.update({n: {} for n in names})
    ok = False
    try:
        with PlaybookProgress(names, title=f"{kind} {name}", console=console.rich) as progress:
            _watch(server, names, outcome, progress, run_dir)
        hosts, errors = {}, {}
        summary = progress.summary()
        expected = expected_probes(groups=bundle.manifest.get("probes"))
        for node in names:
            got = outcome[node]
            hosts[node] = HostStats.of(got.get("stats") or summary[node])
            why = got.get("why") or progress.errors().get(node)
            if got.get("rc") != 0 and not why:
                why = f"the {'bootstrap' if site else 'patch play'} ended with exit {got.get('rc')}"
            if not why:
                why = verdicts.unproven(hosts[node], got, expected)
            if why:
                errors[node] = why
                console.say(f"  {node}: FAILED {why}")
        ok = not errors
        result = ProvisionResult(cluster=name, ok=ok, hosts=hosts, errors=errors)
    finally:
        store.finish_run(run_id, ok, serialise({"hosts": {n: outcome[n].get("stats") for n in names},
                                                "errors": {n: outcome[n].get("why") for n in names}}))
    if not site:
        return result, PullReport(bundle_sha256=bundle.sha256, bundle_bytes=bundle.size)
    if ok and not tags:
        _record_manifests(store, name, nodes, outcome, bundle, profiles or {}, console)
        store.set_cluster_state(name, "bootstrapped")
    elif not ok:
        store.set_failed_step(name, "bootstrap")
    verify = verdicts.record_probes(store, name, names, outcome, run_dir, console) if ok else None
    return result, PullReport(bundle_sha256=bundle.sha256, bundle_bytes=bundle.size, verify=verify)


def _record_manifests(store: Store, name: str, nodes: list[NodeRecord], outcome: Mapping[str, Mapping[str, Any]],
                      bundle: Bundle, profiles: Mapping[str, str], console: Console) -> None:
    """Each node's manifest, written by its agent after the plays and reported with its
    outcome, recorded as push records one (gpuprov.manifest.steps.record_run): with the inputs
    digest of the node's profile in the bundle. A node without one keeps no record (its next
    `provision` runs it)."""
    scope, me, changes = record.scope_of(None), remote.identity(), {}
    for node in nodes:
        answer = outcome[node.name].get("manifest") or {}
        inputs = bundle.inputs.get(profiles.get(node.name, ""))
        if isinstance(answer.get("digest"), str) and inputs:
            changes[node.name] = record.new_record(node, answer, inputs, scope, me)
        else:
            why = answer.get("error") or ("none reported" if inputs else "no inputs digest for its profile")
            console.say(f"  {node.name}: manifest not written ({why}); its next provision runs it")
    record.write(store, name, changes)


def _watch(server: PullServer | ObjectReports, names: list[str], outcome: dict[str, dict[str, Any]], progress: Any,
           run_dir: Path) -> None:
    start = time.monotonic()
    read = dict.fromkeys(names, 0)
    while True:
        for node, why in list(server.failed.items()):
            # A report that is not what an agent sends fails its node, and that node alone.
            if node in outcome and "rc" not in outcome[node]:
                outcome[node] |= {"rc": None, "why": why}
                progress.hosts[node].error = why
        for node in names:
            events = server.events.get(node, [])
            new, read[node] = events[read[node]:], len(events)
            if new:
                with (run_dir / f"events-{node}.jsonl").open("a") as log:
                    log.writelines(json.dumps(e) + "\n" for e in new)
            for event in new:
                _one(node, event, outcome[node], progress)
        open_nodes = [n for n in names if "rc" not in outcome[n]]
        if not open_nodes:
            return
        now = time.monotonic()
        for node in open_nodes:
            last = server.seen.get(node)
            if last is None and now - start > FIRST_WORD_S:
                outcome[node] |= {"rc": None, "why": f"no word from the node within {FIRST_WORD_S} s of "
                                  "its launch (did it boot? can it reach this machine?)"}
            elif last is not None and now - last > SILENCE_S:
                outcome[node] |= {"rc": None, "why": f"the node went silent for {SILENCE_S} s"}
        server.wait(1.0)


def _one(node: str, event: dict[str, Any], got: dict[str, Any], progress: Any) -> None:
    kind, data = str(event.get("event") or ""), event.get("event_data") or {}
    if kind == "playbook_on_stats":
        got["stats"] = {"ok": data.get("ok", {}).get(node, 0), "changed": data.get("changed", {}).get(node, 0),
                        "failed": data.get("failures", {}).get(node, 0),
                        "unreachable": data.get("dark", {}).get(node, 0),
                        "tasks": progress.hosts[node].tasks}
        progress.hosts[node].task = "ran the plays; probes"
    elif kind in ("refused", "agent_failed"):
        got["why"] = str(data.get("msg") or kind)
        progress.hosts[node].error = got["why"]
    elif kind == "probes":
        got["probes"] = [r for r in data.get("rows") or () if isinstance(r, dict)]
    elif kind == "done":
        got["rc"] = data.get("rc")
        if isinstance(data.get("manifest"), dict):  # checked by gpuprov.pull.reports
            got["manifest"] = data["manifest"]
        progress.hosts[node].done, progress.hosts[node].task = True, "done"
    elif kind.startswith("runner_on_"):
        if kind == "runner_on_ok" and isinstance((data.get("res") or {}).get("report"), dict):
            got["report"] = data["res"]["report"]  # a patch's (checked by gpuprov.pull.reports)
        progress.handle(event)
