"""A pull node's manifest (issue 34: after every successful converge, push or pull, the node
holds one and the state records its digest), each part real on this machine:

- the bundle's callback in a real ``ansible-playbook`` run (local connection, this
  controller's ansible-core, as the agent runs it): it keeps the names of what the tasks
  managed, read by gpuprov.manifest.collect as push reads them, in a file of the node's own,
  and reports none of them (nor any content) to the controller;
- the agent's manifest step running the bundle's node program (``python3 -I -S``, on a
  temporary tree with ``--root`` as tests/unit/test_manifest_node.py runs it): the manifest it
  writes is root-only, its digest is the file's, and push's own check finds it held;
- the controller following real reports over the real pull server: each node's record is
  push's (gpuprov.manifest.record.new_record) with the inputs digest of its profile, which is
  the very digest the next push `provision` computes for that node; a --tags run records none.

The whole pull flow on real nodes: tests/e2e/test_pull_e2e.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console as RichConsole

import gpuprov
from gpuprov.manifest import record, remote, steps
from gpuprov.pull import Boot
from gpuprov.pull import bundle as bundle_mod
from gpuprov.pull.server import PullServer
from tests.unit.node_programs import load_agent, write_status

KEY = b"r" * 32


def _agent():
    return load_agent("gpuprov_pull_agent_manifest")


NODE_DIR = bundle_mod.NODE_DIR
PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - name: A file with a secret in it
      ansible.builtin.copy:
        content: "SECRET-CONTENT {{ token }}\\n"
        dest: "{{ where }}/a.conf"
        mode: "0600"
    - name: A directory
      ansible.builtin.file:
        path: "{{ where }}/d"
        state: directory
        mode: "0755"
    - name: A line
      ansible.builtin.lineinfile:
        path: "{{ where }}/b.conf"
        line: "key=SECRET-LINE"
        create: true
        mode: "0644"
    - name: Files in a loop
      ansible.builtin.copy:
        content: "SECRET-LOOP\\n"
        dest: "{{ where }}/{{ item }}"
        mode: "0644"
      loop: [c1.conf, c2.conf]
    - name: A package's selection, read only
      ansible.builtin.dpkg_selections:
        name: dpkg
        selection: install
      check_mode: true
    - name: Skipped
      ansible.builtin.copy:
        content: "x"
        dest: "{{ where }}/skipped.conf"
        mode: "0644"
      when: false
    - name: A command names nothing
      ansible.builtin.command: "true"
      changed_when: false
"""


def _play(tmp_path: Path) -> tuple[Path, Path]:
    """The playbook run by ansible-playbook with the bundle's callback, as the agent runs it
    (agent.environment's callback variables): the events file and the items file."""
    where = tmp_path / "managed"
    where.mkdir()
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    events, kept = tmp_path / "events.jsonl", tmp_path / "items.jsonl"
    env = {**os.environ, "ANSIBLE_CALLBACK_PLUGINS": str(NODE_DIR), "ANSIBLE_CALLBACKS_ENABLED": "gpuprov_pull",
           "ANSIBLE_HOME": str(tmp_path / "ansible-home"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
           "ANSIBLE_NOCOLOR": "1", "GPUPROV_PULL_EVENTS": str(events), "GPUPROV_PULL_NODE": "n1",
           "GPUPROV_PULL_ITEMS": str(kept)}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from ansible.cli.playbook import main; "
         "sys.argv[0] = 'ansible-playbook'; main()", "-i", "n1,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"where={where}", "-e", "token=T0KEN",
         str(tmp_path / "site.yml")], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return events, kept


def test_the_callback_keeps_what_each_task_managed_on_the_node_and_reports_none_of_it(tmp_path: Path) -> None:
    events, kept = _play(tmp_path)
    where = tmp_path / "managed"
    lines = [json.loads(line) for line in kept.read_text().splitlines()]
    # Each item once, from the tasks that ran: the skipped one and the command name nothing.
    assert lines == [{"kind": "path", "name": f"{where}/a.conf"}, {"kind": "path", "name": f"{where}/d"},
                     {"kind": "path", "name": f"{where}/b.conf"}, {"kind": "path", "name": f"{where}/c1.conf"},
                     {"kind": "path", "name": f"{where}/c2.conf"}, {"kind": "package", "name": "dpkg"}]
    # No content, no argument beyond a name, in either file; the reports carry no item.
    for path in (kept, events):
        text = path.read_text()
        assert "SECRET" not in text and "T0KEN" not in text
    oks = [json.loads(line)["event_data"] for line in events.read_text().splitlines()
           if json.loads(line)["event"] == "runner_on_ok"]
    assert len(oks) == 6 and all(set(ok["res"]) == {"changed"} for ok in oks)


def test_past_its_cap_the_callback_says_so_once_and_a_tags_run_keeps_nothing(tmp_path: Path, monkeypatch) -> None:
    """With the results Ansible hands a callback, of a real Task (Ansible's own classes), the cap lowered to 2."""
    import importlib.util

    from ansible.executor.task_result import CallbackTaskResult
    from ansible.inventory.host import Host
    from ansible.playbook.task import Task
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()  # as ansible-playbook does before it loads a task
    spec = importlib.util.spec_from_file_location("gpuprov_pull_callback_cap", NODE_DIR / "gpuprov_pull.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "MAX_ITEMS", 2)
    monkeypatch.setenv("GPUPROV_PULL_ITEMS", str(tmp_path / "items.jsonl"))
    monkeypatch.setenv("GPUPROV_PULL_EVENTS", str(tmp_path / "events.jsonl"))
    callback = module.CallbackModule()
    task = Task.load({"name": "copy", "ansible.builtin.copy": {"dest": "/etc/x", "content": "c"}})
    for name in ("/etc/a", "/etc/a", "/etc/b", "/etc/c", "/etc/d"):
        callback.v2_runner_on_ok(CallbackTaskResult(Host("n1"), task, {"changed": True, "dest": name}, {}))
    lines = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert lines == [{"kind": "path", "name": "/etc/a"}, {"kind": "path", "name": "/etc/b"},
                     {"kind": "overflow", "name": "more than 2 items"}]
    # A name no path can have (past MAX_NAME): the same, once.
    (tmp_path / "items.jsonl").unlink()
    callback = module.CallbackModule()
    for name in ("/etc/a", "/" + "x" * module.MAX_NAME, "/etc/b"):
        callback.v2_runner_on_ok(CallbackTaskResult(Host("n1"), task, {"changed": True, "dest": name}, {}))
    lines = [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()]
    assert lines == [{"kind": "path", "name": "/etc/a"},
                     {"kind": "overflow", "name": f"a name of {module.MAX_NAME + 1} characters"}]
    # A run of some plays (--tags): the agent names no items file, and the callback keeps nothing.
    (tmp_path / "items.jsonl").unlink()
    env = _agent().environment(tmp_path, tmp_path / "events.jsonl", {"node": "n1"}, None)
    assert "GPUPROV_PULL_ITEMS" not in env and env["ANSIBLE_CALLBACKS_ENABLED"] == "gpuprov_pull"
    monkeypatch.delenv("GPUPROV_PULL_ITEMS")
    callback, before = module.CallbackModule(), (tmp_path / "events.jsonl").read_text().count("runner_on_ok")
    callback.v2_runner_on_ok(CallbackTaskResult(Host("n1"), task, {"changed": True, "dest": "/etc/a"}, {}))
    assert not (tmp_path / "items.jsonl").exists()
    assert (tmp_path / "events.jsonl").read_text().count("runner_on_ok") == before + 1  # reported all the same


# -- the agent's manifest step --------------------------------------------------------------------
@pytest.fixture
def unpacked(tmp_path: Path) -> Path:
    """An unpacked bundle's manifest program where the bundle carries it (test_pull.py checks
    the bundle has it there)."""
    root = tmp_path / "bundle"
    (root / "lib/gpuprov/manifest").mkdir(parents=True)
    shutil.copy(remote.__file__.replace("remote.py", "node.py"), root / "lib/gpuprov/manifest/node.py")
    return root


@pytest.fixture
def node(tmp_path: Path) -> Path:
    tree = tmp_path / "node"
    for rel, text in {"etc/docker/daemon.json": "{}\n", "etc/os-release": 'ID=debian\nVERSION_ID="12"\n'}.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / "var/lib/dpkg/info").mkdir(parents=True)
    (tree / "var/lib/dpkg/updates").mkdir()
    write_status(tree, {"libnccl2": ("install", "2.16.5-1"), "nvidia-driver-580": ("hold", "580.159.04-1")})
    return tree


def _items(path: Path, *items: dict) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def test_the_agent_writes_the_manifest_that_pushs_check_finds_held(unpacked, node, tmp_path) -> None:
    agent = _agent()
    assert agent.MANIFEST_SCOPE == record.SITE
    items = _items(tmp_path / "items.jsonl", {"kind": "path", "name": "/etc/docker/daemon.json"},
                   {"kind": "package", "name": "libnccl2"})
    answer = agent.write_manifest(unpacked, {"gpuprov": gpuprov.__version__, "tags": []}, items, node_root=str(node))
    written = node / "var/lib/gpuprov/manifest.json"
    data = written.read_bytes()
    assert answer == {"digest": hashlib.sha256(data).hexdigest(), "items": 3}
    assert stat.S_IMODE(written.stat().st_mode) == 0o600 and written.stat().st_uid == os.getuid()
    manifest = json.loads(data)
    # Push's identity (this gpuprov, this program's bytes), the site's scope, the held package too.
    assert (manifest["gpuprov"], manifest["program"], manifest["scope"]) == \
        (remote.identity()["gpuprov"], remote.identity()["program"], "site")
    assert [(i["kind"], i["name"]) for i in manifest["items"]] == [
        ("package", "libnccl2"), ("package", "nvidia-driver-580"), ("path", "/etc/docker/daemon.json")]
    # Push's check of it, as `provision` asks it over SSH: held, the digest the agent reported.
    check = subprocess.run([sys.executable, "-I", "-S", str(unpacked / "lib/gpuprov/manifest/node.py"),
                            "--root", str(node), "check"], input=json.dumps(remote.identity()),
                           capture_output=True, text=True, check=True)
    assert json.loads(check.stdout) == {"state": "held", "digest": answer["digest"], "items": 3, "drift": []}


def test_the_agent_writes_no_manifest_past_the_items_cap_or_when_its_program_fails(unpacked, node,
                                                                                   tmp_path) -> None:
    agent = _agent()
    me = {"gpuprov": gpuprov.__version__, "tags": []}
    items = _items(tmp_path / "over.jsonl", {"kind": "path", "name": "/etc/docker/daemon.json"},
                   {"kind": "overflow", "name": "more than 20000 items"})
    assert agent.write_manifest(unpacked, me, items, node_root=str(node)) == {"error": "more than 20000 items"}
    assert not (node / "var/lib/gpuprov/manifest.json").exists()
    # The program fails (its request lacks the version it must carry): the reason, in one line.
    items = _items(tmp_path / "items.jsonl", {"kind": "path", "name": "/etc/docker/daemon.json"})
    failed = agent.write_manifest(unpacked, {"tags": []}, items, node_root=str(node))
    assert failed == {"error": "the manifest was not written: KeyError: 'gpuprov'"}
    (unpacked / "lib/gpuprov/manifest/node.py").write_text("import sys\nsys.exit('no manifest here')\n")
    assert agent.write_manifest(unpacked, me, items, node_root=str(node)) == {
        "error": "the manifest program failed: no manifest here"}
    assert not (node / "var/lib/gpuprov/manifest.json").exists()


# -- the controller records it ----------------------------------------------------------------------
def _reports(every: list[dict], manifest: dict | None) -> list[tuple[str, dict]]:
    done = {"rc": 0, **({"manifest": manifest} if manifest is not None else {})}
    return [("runner_on_start", {"task": "Install", "role": "rdma", "task_action": "apt"}),
            ("runner_on_ok", {"task": "Install", "role": "rdma", "task_action": "apt", "res": {"changed": True}}),
            ("probes", {"rows": every}), ("done", done)]


def _follow(tmp_path: Path, tags: list[str], manifests: dict[str, dict | None]):
    from gpuprov.console import Console
    from gpuprov.pull.bundle import Bundle
    from gpuprov.pull.controller import expected_probes, follow
    from gpuprov.state import NodeRecord, Store

    agent = _agent()
    every = [{"probe": p, "status": "pass", "detail": "ok"} for p in sorted(expected_probes())]
    store = Store(tmp_path / "state.db")
    store.create_cluster("c", "docker", {})
    # Records of an earlier converge: a run of every play replaces them, a --tags run leaves them.
    record.write(store, "c", {n: {"id": n, "digest": "old", "scope": "site"} for n in manifests})
    out = io.StringIO()
    console = Console()
    console.rich = RichConsole(file=out, width=300, highlight=False)
    bundle = Bundle(data=b"bundle", sha256=hashlib.sha256(b"bundle").hexdigest(), manifest={"format": 1},
                    inputs={"p1": "1" * 64, "p2": "2" * 64})
    with PullServer("127.0.0.1", KEY, bundle.data, bundle.sha256, []) as server:
        for name, manifest in manifests.items():
            (tmp_path / name).mkdir()
            boot = Boot(bundle_url="", report_url=f"{server.base_url}/report", sha256=bundle.sha256, key=KEY)
            reporter = agent.Reporter(boot.node_config(name, ""), tmp_path / name / "events.jsonl")
            for kind, fields in _reports(every, manifest):
                reporter.add(kind, **fields)
            assert reporter.send() is True
        nodes = [NodeRecord(name=n, id=f"id-{n}", address="", ssh_port=0, user="", state="running")
                 for n in manifests]
        (tmp_path / "run").mkdir()
        result, _ = follow(store, "c", server, bundle, nodes, tmp_path / "run", console=console, tags=tags,
                           profiles={"n1": "p1", "n2": "p2", "n3": "p1"})
    assert result.ok, result.errors
    return record.records(store.get_cluster("c")), out.getvalue()


def test_follow_records_each_nodes_manifest_as_push_does(tmp_path: Path) -> None:
    digest = "ab" * 32
    found, said = _follow(tmp_path, [], {"n1": {"digest": digest, "items": 103}, "n2": {"digest": "cd" * 32,
                                                                                          "items": 7},
                                         "n3": {"error": "the manifest program failed: disk full"}})
    me = remote.identity()
    assert set(found) == {"n1", "n2"}  # n3 wrote none: its old record is gone, its next provision runs it
    assert {k: v for k, v in found["n1"].items() if k != "recorded"} == {
        "id": "id-n1", "digest": digest, "inputs": "1" * 64, "scope": "site", "items": 103, **me}
    assert found["n2"]["inputs"] == "2" * 64 and found["n2"]["digest"] == "cd" * 32
    assert "n3: manifest not written (the manifest program failed: disk full); its next provision runs it" in said


def test_a_tags_run_records_no_manifest_and_leaves_the_records_it_found(tmp_path: Path) -> None:
    found, said = _follow(tmp_path, ["rdma"], {"n1": None})
    assert found == {"n1": {"id": "n1", "digest": "old", "scope": "site"}} and "manifest" not in said


def test_a_node_that_reports_no_manifest_keeps_no_record(tmp_path: Path) -> None:
    found, said = _follow(tmp_path, [], {"n1": None})
    assert found == {} and "n1: manifest not written (none reported)" in said


# -- the inputs digest: the one the next push `provision` computes ---------------------------------
def test_a_pulled_nodes_inputs_digest_is_the_one_push_computes(tmp_path: Path, monkeypatch) -> None:
    """push: run_site's inventory (render) and variables (playbook_vars and the scheduler's),
    then gpuprov.manifest.steps.inputs_of, as `provision` computes them; pull: the bundle the
    controller builds for the same cluster's nodes."""
    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    from gpuprov.ansible.inventory import render
    from gpuprov.cluster import expectations, files_for, version_lock
    from gpuprov.core.monitoring import monitoring_host
    from gpuprov.providers import ClusterSpec
    from gpuprov.providers import get as get_provider
    from gpuprov.pull.controller import bundle_for, play_vars
    from gpuprov.settings import playbook_vars
    from gpuprov.slurm import scheduler
    from gpuprov.state import NodeRecord, Store

    store = Store(tmp_path / "state.db")
    store.create_cluster("c", "docker", {"instance_type": "docker-node"})
    nodes = [NodeRecord(name=f"c-node-{i}", id=f"id{i}", address="127.0.0.1", ssh_port=2200 + i, user="gpuprov",
                        state="running", instance_type="docker-node") for i in (1, 2)]
    store.replace_nodes("c", nodes)
    cluster = store.get_cluster("c")
    lock = version_lock(store, cluster)
    cluster = store.get_cluster("c")
    provider, files = get_provider("docker"), files_for("c")
    context = render("c", "docker", nodes, expectations(provider, nodes, lock), files, monitoring_host(cluster.spec))
    extravars = playbook_vars(cluster, lock) | scheduler.play_vars(cluster, files, nodes)
    scope, push = steps.inputs_of(context, extravars, None)
    assert scope == record.SITE and len(set(push.values())) == 1  # the nodes differ only in how they are reached
    # As `up` asks for them (no type: the provider's), the bundle built for the nodes that exist
    # (static hosts, AWS) and the one built before the launch for the nodes to come (one
    # profile for them all, from a node record with the spec's type only).
    spec = provider.check_spec(ClusterSpec(name="c", provider="docker", instance_type=None, count=2,
                                           options=provider.options_type()))
    bundle, profiles = bundle_for(provider, spec, lock, play_vars(cluster, lock), [], nodes)
    assert {n.name: bundle.inputs[profiles[n.name]] for n in nodes} == push
    proto = NodeRecord(name="", id="", address="", ssh_port=0, user="", state="", instance_type=spec.instance_type)
    bundle, profiles = bundle_for(provider, spec, lock, play_vars(cluster, lock), [], [proto])
    assert bundle.inputs[profiles[""]] == push["c-node-1"]
    # ... and it would not be without the scheduler's variable push adds (the digest looks).
    from gpuprov.ansible.inventory import to_json

    hostvars = to_json(context)["_meta"]["hostvars"]["c-node-1"]
    assert record.inputs_digest(playbook_vars(cluster, lock), hostvars, scope, remote.identity()) != push["c-node-1"]
    assert record.inputs_digest(extravars, hostvars, scope, remote.identity()) == push["c-node-1"]
    # A host's own free-space floor (an existing host's hosts file) is one of its inputs, on both
    # paths, and the host's value is the one that counts (over the group's, as Ansible merges).
    own = [NodeRecord(name=n.name, id=n.id, address=n.address, ssh_port=n.ssh_port, user=n.user, state=n.state,
                      instance_type=n.instance_type, extra={"root_free_gib": 12} if i else {})
           for i, n in enumerate(nodes)]
    context = render("c", "docker", own, expectations(provider, own, lock), files, monitoring_host(cluster.spec))
    _, push = steps.inputs_of(context, extravars, None)
    assert to_json(context)["_meta"]["hostvars"]["c-node-2"]["gpu_preflight_root_free_gib"] == 12
    assert push["c-node-1"] != push["c-node-2"]
    bundle, profiles = bundle_for(provider, spec, lock, play_vars(cluster, lock), [], own)
    assert {n.name: bundle.inputs[profiles[n.name]] for n in own} == push
    # So is a host that keeps apt's downloads.
    kept = [NodeRecord(name=n.name, id=n.id, address=n.address, ssh_port=n.ssh_port, user=n.user, state=n.state,
                       instance_type=n.instance_type, extra={"apt_keep_downloads": True} if i else {})
            for i, n in enumerate(nodes)]
    context = render("c", "docker", kept, expectations(provider, kept, lock), files, monitoring_host(cluster.spec))
    _, push = steps.inputs_of(context, extravars, None)
    assert to_json(context)["_meta"]["hostvars"]["c-node-2"]["gpu_preflight_apt_keep_downloads"] is True
    assert push["c-node-1"] != push["c-node-2"]
    bundle, profiles = bundle_for(provider, spec, lock, play_vars(cluster, lock), [], kept)
    assert {n.name: bundle.inputs[profiles[n.name]] for n in kept} == push
