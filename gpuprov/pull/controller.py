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
from typing import Any

from gpuprov import paths, ssh
from gpuprov.ansible import inventory
from gpuprov.ansible.progress import PlaybookProgress
from gpuprov.ansible.runner import new_run_dir
from gpuprov.errors import GpuprovError
from gpuprov.manifest import record, remote
from gpuprov.providers import ClusterSpec, Provider
from gpuprov.pull import Boot
from gpuprov.pull.bundle import Bundle, build
from gpuprov.pull.objects import ObjectReports
from gpuprov.pull.server import PullServer
from gpuprov.shared.cluster import load, phase_at_least, version_lock
from gpuprov.shared.console import Console
from gpuprov.shared.results import HostStats, ProbeRow, ProvisionResult, PullReport, VerifySummary, serialise
from gpuprov.shared.settings import playbook_vars
from gpuprov.state import NodeRecord, Store

# A node that has not said a word this long after its launch (boot, fetch) has failed, and
# so has one silent this long once it started (the agent reports at least every few seconds
# while Ansible runs: a task that runs longer still writes nothing, so the margin is wide).
FIRST_WORD_S = 900
SILENCE_S = 1200


def play_vars(cluster: Any, lock: Mapping[str, Any]) -> dict[str, Any]:
    """The bundle's play variables: push's for a cluster without Slurm (gpuprov.converge's,
    with gpuprov.shared.scheduler's ``none``: pull never configures Slurm, refused at launch),
    so that a pulled node's inputs digest is the one the next push `provision` computes."""
    return playbook_vars(cluster, dict(lock)) | {"gpuprov_scheduler": "none"}


@dataclass
class Session:
    """A pull bootstrap under way: its bundle, the server, the nodes' boot configuration."""

    bundle: Bundle
    server: Any  # PullServer, or ObjectReports through a provider's object store
    boot: Boot
    report: PullReport | None = None


@contextmanager
def serving(run: Any) -> Iterator[None]:
    """Around one `up`'s launch and bootstrap (``run``: gpuprov.core.launching.Run): in pull mode,
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
def _served(run: Any, bundle: Bundle, nodes: list[NodeRecord], profile: str, whom: str) -> Iterator[Session]:
    key = secrets.token_bytes(32)
    with PullServer(run.provider.pull_address(run.spec, nodes), key, bundle.data, bundle.sha256, ()) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{bundle.sha256}",
                    report_url=f"{server.base_url}/report", sha256=bundle.sha256, key=key, profile=profile)
        run.console.say(f"  pull: bundle {bundle.sha256[:16]} ({bundle.size / 1e6:.1f} MB, ansible-core "
                        f"{bundle.manifest['ansible_core']}) served on {server.base_url} to {whom}")
        run.pull = Session(bundle=bundle, server=server, boot=boot)
        yield run.pull


def bootstrap(run: Any, cluster: Any, nodes: list[NodeRecord], *,
              push: Callable[..., ProvisionResult]) -> ProvisionResult:
    """The pull bootstrap of the nodes this `up` launched (they pulled at boot); any other node
    that needs one (a cluster resumed after a failed run) is pushed (``push``: the caller's
    site.yml run, gpuprov.core.converge's), and says so. Through a provider's object store
    (aws), every node given pulls: each is handed its configuration over SSH."""
    if run.provider.supports("pull_channel") or run.pull is None:
        return existing(run, cluster, nodes)
    session: Session = run.pull
    added = {n.name for n in run.added}
    pulled = [n for n in nodes if n.name in added]
    others = [n for n in nodes if n.name not in added]
    result, session.report = follow(run.store, run.name, session.server, session.bundle, pulled,
                                    new_run_dir(run.files, "bootstrap-pull"), console=run.console, tags=run.tags,
                                    profiles=dict.fromkeys((n.name for n in pulled), session.boot.profile))
    if not others:
        return result
    run.console.say(f"  push: {', '.join(n.name for n in others)} (not launched by this run)")
    pushed = push(run.store, cluster, run.provider, run.files, others, console=run.console,
                        tags=run.tags or None)
    return ProvisionResult(cluster=run.name, ok=result.ok and pushed.ok, hosts={**result.hosts, **pushed.hosts},
                           errors={**result.errors, **pushed.errors})


def existing(run: Any, cluster: Any, nodes: list[NodeRecord], kind: str = "bootstrap-pull") -> ProvisionResult:
    """Pull on nodes that are up (hosts that exist, a cluster converged again by `provision --via
    pull`): through the provider's object store (aws: its bucket, each round anew), or served
    from here; each node handed its configuration over SSH. The run is recorded as ``kind``."""
    if run.provider.supports("pull_channel"):
        return _through_channel(run, cluster, nodes, kind)
    return _existing_hosts(run, cluster, nodes, kind)


def _existing_hosts(run: Any, cluster: Any, nodes: list[NodeRecord], kind: str) -> ProvisionResult:
    """Pull on hosts gpuprov did not boot: the bundle is built for what their PCI buses
    showed, served, and each host is handed the agent, its unit and its configuration over
    SSH (pinned host key); the agent starts there and the run goes on as at boot."""
    lock = version_lock(run.store, load(run.store, run.name))  # as the hosts' buses relocked it
    bundle, profiles = bundle_for(run.provider, run.spec, lock, play_vars(cluster, lock), run.tags, nodes)
    with _served(run, bundle, nodes, "", f"{len(nodes)} host(s)") as session:
        ssh.each_node(nodes, lambda n: _hand_over(n, run.files, session.boot, profiles[n.name]))
        for node in nodes:
            run.console.say(f"  {node.name}: pull agent started over SSH")
        result, session.report = follow(run.store, run.name, session.server, bundle, nodes,
                                        new_run_dir(run.files, kind), console=run.console,
                                        tags=run.tags, profiles=profiles, kind=kind)
    return result


def _through_channel(run: Any, cluster: Any, nodes: list[NodeRecord], kind: str) -> ProvisionResult:
    """Pull through the provider's object store (aws: the cluster's S3 bucket): the bundle
    published once under its sha256, each node handed over SSH (pinned host key) its presigned
    GET and its report POST policy, the reports listed and read from the store."""
    lock = version_lock(run.store, load(run.store, run.name))
    bundle, profiles = bundle_for(run.provider, run.spec, lock, play_vars(cluster, lock), run.tags, nodes)
    channel = run.provider.pull_channel(run.spec, run.console.say)
    new = channel.publish(bundle.data, bundle.sha256)
    run.console.say(f"  pull: bundle {bundle.sha256[:16]} ({bundle.size / 1e6:.1f} MB, ansible-core "
                    f"{bundle.manifest['ansible_core']}) {'uploaded to' if new else 'already in'} "
                    f"{channel.bucket} for {len(nodes)} node(s)")
    key = secrets.token_bytes(32)
    boot = Boot(bundle_url="", report_url="", sha256=bundle.sha256, key=key, channel=channel)
    reports = ObjectReports(channel, key, [n.name for n in nodes])
    run.pull = Session(bundle=bundle, server=reports, boot=boot)
    ssh.each_node(nodes, lambda n: _hand_over(n, run.files, boot, profiles[n.name]))
    run.console.say(f"  pull agent handed over SSH to {len(nodes)} node(s)")
    result, run.pull.report = follow(run.store, run.name, reports, bundle, nodes,
                                     new_run_dir(run.files, kind), console=run.console, tags=run.tags,
                                     profiles=profiles, kind=kind)
    channel.remove_reports([n.name for n in nodes])  # recorded in the run's directory now
    return result


# On the host, as root: the archive (Boot.archive: fixed paths) unpacked at /, and the agent's
# unit (re)started without waiting for it. Nothing from a hosts file reaches it but the login.
_HAND_OVER = ("sudo -n sh -c 'tar -x -o -C / -f - && systemctl daemon-reload && "
              "systemctl restart --no-block gpuprov-pull.service'")


def _hand_over(node: NodeRecord, files: Any, boot: Boot, profile: str) -> None:
    import subprocess

    proc = subprocess.run(
        ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.key)),
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}", _HAND_OVER],
        input=boot.archive(node.name, profile), capture_output=True, check=False, timeout=120)
    if proc.returncode != 0:
        why = ssh.ssh_error_line(proc.stderr.decode(errors="replace"), proc.returncode)
        raise GpuprovError(f"{node.name}: the pull agent could not be handed over ({why})")


def bundle_for(provider: Provider, spec: ClusterSpec, lock: Mapping[str, Any], extravars: Mapping[str, Any],
               tags: list[str], nodes: list[NodeRecord]) -> tuple[Bundle, dict[str, str]]:
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
                   profiles=profiles, tags=tags)
    return bundle, chosen


def follow(store: Store, name: str, server: PullServer | ObjectReports, bundle: Bundle, nodes: list[NodeRecord],
           run_dir: Path, *, console: Console, tags: list[str], profiles: Mapping[str, str] | None = None,
           kind: str = "bootstrap-pull") -> tuple[ProvisionResult, PullReport]:
    """Wait for the nodes' reports, showing them as push progress; record the bootstrap and the
    nodes' own probe runs as a bootstrap run and a verify run, and (a run of every play that
    succeeded) each node's manifest as push records it. ``profiles``: each node's profile in
    the bundle (whose inputs digest its manifest is recorded with)."""
    names = [n.name for n in nodes]
    server.add_nodes(names)
    if not tags:  # as push: until the run succeeds, the nodes it converges hold no record
        record.write(store, name, dict.fromkeys(names))
    (run_dir / "manifest.json").write_text(json.dumps(bundle.manifest, indent=1) + "\n")
    run_id = store.start_run(name, kind, str(run_dir))
    outcome: dict[str, dict[str, Any]] = {n: {} for n in names}
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
                why = f"the bootstrap ended with exit {got.get('rc')}"
            if not why:
                why = _unproven(hosts[node], got, expected)
            if why:
                errors[node] = why
                console.say(f"  {node}: FAILED {why}")
        ok = not errors
        result = ProvisionResult(cluster=name, ok=ok, hosts=hosts, errors=errors)
    finally:
        store.finish_run(run_id, ok, serialise({"hosts": {n: outcome[n].get("stats") for n in names},
                                                "errors": {n: outcome[n].get("why") for n in names}}))
    if ok and not tags:
        _record_manifests(store, name, nodes, outcome, bundle, profiles or {}, console)
        store.set_cluster_state(name, "bootstrapped")
    elif not ok:
        store.set_failed_step(name, "bootstrap")
    verify = _record_probes(store, name, names, outcome, run_dir, console) if ok else None
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


def expected_probes(probes_dir: Path | None = None, groups: str | None = None) -> set[str]:
    """The probes a node's quick verification runs (the agent runs them with ``-m "not
    full"``, and ``groups``: the bundle's "probes", groups_of_plays' "base or rdma ...", when the
    plays were some): each probe module's test functions, by the name its rows carry
    (collect.py), read from the probes the bundle carries (this gpuprov's)."""
    import ast
    import re

    wanted = set(groups.split(" or ")) if groups else None

    def marks(exprs: list[ast.expr]) -> set[str]:
        return {m for e in exprs for m in re.findall(r"mark\.(\w+)", ast.unparse(e))}

    names = set()
    for module in sorted((probes_dir or paths.probes_dir()).glob("test_*.py")):
        tree = ast.parse(module.read_text(), str(module))
        own = marks([s.value for s in tree.body if isinstance(s, ast.Assign)
                     and "pytestmark" in ast.unparse(s.targets[0])])
        for f in tree.body:
            if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
                continue
            mine = own | marks(f.decorator_list)
            if "full" not in mine and (wanted is None or mine & wanted):
                names.add(f.name.removeprefix("test_"))
    return names


def _unproven(stats: HostStats, got: Mapping[str, Any], expected: set[str]) -> str | None:
    """Why a node that reported success has proved nothing, as push says it
    (gpuprov.ansible.runner): no task ran there, or its probes are not all there."""
    if stats.tasks == 0 and not stats.failed and not stats.unreachable:
        return "no task ran on this node"
    missing = sorted(expected - {str(r.get("probe")) for r in got.get("probes") or ()})
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return f"its report lacks {len(missing)} of the {len(expected)} probes it must run: {shown}"
    return None


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
    kind, data = event.get("event"), event.get("event_data") or {}
    if kind == "playbook_on_stats":
        got["stats"] = {"ok": data.get("ok", {}).get(node, 0), "changed": data.get("changed", {}).get(node, 0),
                        "failed": data.get("failures", {}).get(node, 0),
                        "unreachable": data.get("dark", {}).get(node, 0),
                        "tasks": progress.hosts[node].tasks}
        progress.hosts[node].task = "ran site.yml; probes"
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
        progress.handle(event)


def _record_probes(store: Store, name: str, names: list[str], outcome: Mapping[str, Mapping[str, Any]],
                   run_dir: Path, console: Console) -> VerifySummary | None:
    """The probes each node ran on itself, recorded as `gpuprov verify` records its own."""
    rows = {n: [ProbeRow.of(r) for r in outcome[n].get("probes") or ()] for n in names}
    if not all(rows.values()):
        return None
    counts = {"pass": 0, "fail": 0, "skip": 0}
    for node, found in rows.items():
        mine = dict.fromkeys(counts, 0)
        for row in sorted(found, key=lambda r: r.probe):
            counts[row.status] += 1
            mine[row.status] += 1
            if row.status == "fail":
                console.say(f"  {node}: FAIL {row.probe}: {row.detail}")
        console.say(f"  {node}: {mine['pass']} pass, {mine['fail']} fail, {mine['skip']} skip (probes run on the node)")
    (run_dir / "probes.json").write_text(json.dumps(
        {n: [dataclasses.asdict(r) for r in found] for n, found in rows.items()}, indent=1) + "\n")
    ok = counts["fail"] == 0
    run_id = store.start_run(name, "verify-quick", str(run_dir))
    store.finish_run(run_id, ok, counts)
    cluster = store.get_cluster(name)
    if ok and cluster is not None and phase_at_least(cluster, "bootstrapped"):
        store.set_cluster_state(name, "verified")
    return VerifySummary(pass_=counts["pass"], fail=counts["fail"], skip=counts["skip"])
