"""`up --bootstrap pull` on the controller: build and serve the bundle, hand each new node its
boot configuration, then follow the nodes' reports to the same result a push run gives.

The server runs from before the launch (a node fetches its bundle as soon as it boots) until
every node it launched has reported its outcome, or has been silent past its deadline.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprov.core import Console, phase_at_least
from gpuprov.core.results import HostStats, ProbeRow, ProvisionResult, PullReport, VerifySummary, serialise
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec, Provider
from gpuprov.pull import Boot, choose
from gpuprov.state import NodeRecord, Store

if TYPE_CHECKING:  # the bundle and the server are imported when a pull runs (start-up time)
    from gpuprov.pull.bundle import Bundle
    from gpuprov.pull.server import PullServer

# A node that has not said a word this long after its launch (boot, fetch) has failed, and
# so has one silent this long once it started (the agent reports at least every few seconds
# while Ansible runs: a task that runs longer still writes nothing, so the margin is wide).
FIRST_WORD_S = 900
SILENCE_S = 1200
_CONNECTION_VARS = ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                    "ansible_ssh_common_args")


def mode_for(requested: str, provider: Provider, spec: ClusterSpec, bootstrap: bool) -> str:
    """How this `up`'s new nodes bootstrap (`--bootstrap`); where pull cannot run, one line and
    exit 2 before anything is created."""
    from gpuprov.core.settings import play_secrets

    mode = choose(requested, spec.count, provider.supports("pull_address"))
    if mode != "pull":
        return mode
    if not bootstrap:
        raise BadInput("--bootstrap pull says how nodes bootstrap; it cannot go with --no-bootstrap")
    if not provider.supports("pull_address"):
        raise BadInput(f"--bootstrap pull is not built for the {provider.name} provider yet; "
                       "use --bootstrap push")
    if play_secrets():
        raise BadInput("--bootstrap pull does not carry GPUPROV_REGISTRY_PASSWORD to the nodes "
                       "(the bundle holds no secret); use --bootstrap push")
    return mode


@dataclass
class Session:
    """A pull bootstrap under way: its bundle, the server, the nodes' boot configuration."""

    bundle: Bundle
    server: PullServer
    boot: Boot
    report: PullReport | None = None


@contextmanager
def serving(run: Any) -> Iterator[None]:
    """Around one `up`'s launch and bootstrap (``run``: gpuprov.core.launching.Run): in pull mode,
    the bundle built and served, and the plan carrying the nodes' boot configuration."""
    if run.mode != "pull":
        yield
        return
    from gpuprov.core import load
    from gpuprov.core.settings import playbook_vars
    from gpuprov.pull.server import PullServer

    extravars = playbook_vars(load(run.store, run.name), run.lock)
    bundle = bundle_for(run.provider, run.spec, run.lock, extravars, run.tags)
    key = secrets.token_bytes(32)
    with PullServer(run.provider.pull_address(run.spec), key, bundle.data, bundle.sha256, ()) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{bundle.sha256}",
                    report_url=f"{server.base_url}/report", sha256=bundle.sha256, key=key)
        run.console.say(f"  pull: bundle {bundle.sha256[:16]} ({bundle.size / 1e6:.1f} MB, ansible-core "
                        f"{bundle.manifest['ansible_core']}) served on {server.base_url} to this "
                        "launch's nodes")
        run.plan = dataclasses.replace(run.plan, pull=boot)
        run.pull = Session(bundle=bundle, server=server, boot=boot)
        try:
            yield
        finally:
            run.pull = None


def bootstrap(run: Any, cluster: Any, nodes: list[NodeRecord]) -> ProvisionResult:
    """The pull bootstrap of the nodes this `up` launched (they pulled at boot); any other node
    that needs one (a cluster resumed after a failed run) is pushed, and says so."""
    from gpuprov.ansible.runner import new_run_dir
    from gpuprov.core.converge import _provision

    session: Session = run.pull
    added = {n.name for n in run.added}
    pulled = [n for n in nodes if n.name in added]
    others = [n for n in nodes if n.name not in added]
    result, session.report = follow(run.store, run.name, session.server, session.bundle, pulled,
                                    new_run_dir(run.files, "bootstrap-pull"), console=run.console, tags=run.tags)
    if not others:
        return result
    run.console.say(f"  push: {', '.join(n.name for n in others)} (not launched by this run)")
    pushed = _provision(run.store, cluster, run.provider, run.files, others, console=run.console,
                        tags=run.tags or None)
    return ProvisionResult(cluster=run.name, ok=result.ok and pushed.ok, hosts={**result.hosts, **pushed.hosts},
                           errors={**result.errors, **pushed.errors})


def bundle_for(provider: Provider, spec: ClusterSpec, lock: Mapping[str, Any], extravars: Mapping[str, Any],
               tags: list[str]) -> Bundle:
    """The bundle of one cluster's pull bootstrap: its nodes' variables by instance type."""
    from gpuprov.ansible import inventory
    from gpuprov.pull.bundle import build

    itype = spec.instance_type or ""
    proto = NodeRecord(name="", id="", address="", ssh_port=0, user="", state="", instance_type=itype)
    expect = {**provider.expectations(proto), "stack": dict(lock)}
    hostvars = inventory.host_vars({
        "address": "", "ssh_port": 0, "user": "", "key_file": None, "instance_type": itype,
        "expected_gpus": expect.get("gpus"), "expected_nvswitch": bool(expect.get("nvswitch")),
        "expected_efa": bool(expect.get("efa")),
    })
    group_vars = inventory.group_vars({"cluster": spec.name, "provider": spec.provider, "known_hosts": ""})
    return build(
        lock=lock, extravars=extravars, group=inventory.GROUP,
        group_vars={k: v for k, v in group_vars.items() if k not in _CONNECTION_VARS},
        types={itype: {"hostvars": {k: v for k, v in hostvars.items() if k not in _CONNECTION_VARS},
                       "expect": expect}},
        tags=tags,
    )


def follow(store: Store, name: str, server: PullServer, bundle: Bundle, nodes: list[NodeRecord],
           run_dir: Path, *, console: Console, tags: list[str]) -> tuple[ProvisionResult, PullReport]:
    """Wait for the nodes' reports, showing them as push progress; record the bootstrap and the
    nodes' own probe runs as a bootstrap run and a verify run."""
    from gpuprov.ansible.progress import PlaybookProgress

    names = [n.name for n in nodes]
    server.add_nodes(names)
    (run_dir / "manifest.json").write_text(json.dumps(bundle.manifest, indent=1) + "\n")
    run_id = store.start_run(name, "bootstrap-pull", str(run_dir))
    outcome: dict[str, dict[str, Any]] = {n: {} for n in names}
    ok = False
    try:
        with PlaybookProgress(names, title=f"pull bootstrap {name}", console=console.rich) as progress:
            _watch(server, names, outcome, progress, run_dir)
        hosts, errors = {}, {}
        summary = progress.summary()
        for node in names:
            got = outcome[node]
            hosts[node] = HostStats.of(got.get("stats") or summary[node])
            why = got.get("why") or progress.errors().get(node)
            if got.get("rc") != 0 and not why:
                why = f"the bootstrap ended with exit {got.get('rc')}"
            if why:
                errors[node] = why
                console.say(f"  {node}: FAILED {why}")
        ok = not errors
        result = ProvisionResult(cluster=name, ok=ok, hosts=hosts, errors=errors)
    finally:
        store.finish_run(run_id, ok, serialise({"hosts": {n: outcome[n].get("stats") for n in names},
                                                "errors": {n: outcome[n].get("why") for n in names}}))
    if ok and not tags:
        store.set_cluster_state(name, "bootstrapped")
    elif not ok:
        store.set_failed_step(name, "bootstrap")
    verify = _record_probes(store, name, names, outcome, run_dir, console) if ok else None
    return result, PullReport(bundle_sha256=bundle.sha256, bundle_bytes=bundle.size, verify=verify)


def _watch(server: PullServer, names: list[str], outcome: dict[str, dict[str, Any]], progress: Any,
           run_dir: Path) -> None:
    start = time.monotonic()
    read = dict.fromkeys(names, 0)
    while True:
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
