"""Pull mode's parts on this machine: the bundle (content-addressed, complete), the controller's
server (a node reports only as itself, with its own token), the node agent (a bundle of another
sha256 is refused with nothing unpacked; an archive that reaches outside its directory is
refused), and the choice of mode. The whole flow on real nodes is tests/e2e/test_pull_e2e.py."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import tarfile
import urllib.error
import urllib.request
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gpuprov.pull import PULL_ABOVE, Boot, choose, node_token, report_secret, report_signature
from gpuprov.pull import bundle as bundle_mod
from gpuprov.pull.server import PullServer
from tests.unit.node_programs import load_agent


@pytest.fixture(scope="module")
def built() -> bundle_mod.Bundle:
    return bundle_mod.build(lock={"hash": "abc123"}, extravars={"gpuprov_stack": {"hash": "abc123"}},
                            group="gpuprov_nodes", group_vars={"gpuprov_cluster": "c"},
                            profiles={"docker-node": {"hostvars": {"gpuprov_expected_gpus": 0}, "expect": {}}},
                            tags=["spot"])


def _members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_bundle_is_content_addressed_and_byte_for_byte_repeatable(built) -> None:
    again = bundle_mod.build(lock={"hash": "abc123"}, extravars={"gpuprov_stack": {"hash": "abc123"}},
                             group="gpuprov_nodes", group_vars={"gpuprov_cluster": "c"},
                             profiles={"docker-node": {"hostvars": {"gpuprov_expected_gpus": 0}, "expect": {}}},
                             tags=["spot"])
    assert again.data == built.data and built.sha256 == hashlib.sha256(built.data).hexdigest()
    other = bundle_mod.build(lock={"hash": "abc124"}, extravars={}, group="gpuprov_nodes", group_vars={},
                             profiles={}, tags=())
    assert other.sha256 != built.sha256
    assert re.fullmatch(r"[0-9a-f]{64}", built.sha256)


def test_the_bundle_carries_the_site_the_packages_and_nothing_compiled(built) -> None:
    members = _members(built.data)
    names = set(members)
    for needed in ("manifest.json", "site/playbooks/site.yml", "site/roles/gpuprov_lock/vars/main.yml",
                   "site/roles/nvidia_driver/tasks/main.yml", "site/vars.yml", "site/nodes.json",
                   "lib/ansible/cli/playbook.py", "lib/testinfra/__init__.py", "lib/gpuprov/probes/collect.py",
                   "lib/gpuprov/probes/pytest.ini", "plugins/callback/gpuprov_pull.py",
                   # the node's manifest: the program push runs over SSH, and what the callback reads with
                   "lib/gpuprov/manifest/node.py", "lib/gpuprov/manifest/collect.py"):
        assert needed in names, needed
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so")) or "/molecule/" in n]
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 and (m.isfile() or m.isdir()) for m in members.values())
    manifest = json.loads(_read(built.data, "manifest.json"))
    assert manifest["format"] == 1 and manifest["lock_hash"] == "abc123" and manifest["tags"] == ["spot"]
    # The node judges a run of some plays on their probes alone (spot has none of its own).
    assert manifest["probes"] == "base"
    # The roles call ansible.builtin only (tests/unit/test_builtin_modules.py): no collection
    # is needed, none is carried, and each one the roles named would be.
    assert manifest["collections"] == [".".join(c) for c in bundle_mod.collections_used()] == []
    assert not [n for n in names if n.startswith("collections/")]
    import ansible.release

    assert manifest["ansible_core"] == ansible.release.__version__
    assert json.loads(_read(built.data, "site/nodes.json"))["profiles"]["docker-node"]["hostvars"] == {
        "gpuprov_expected_gpus": 0}


def _read(data: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile(name)
        assert member is not None
        return member.read()


def test_every_package_the_node_imports_is_carried() -> None:
    """The requirements of ansible-core, pytest and testinfra (those that apply to Python 3.11
    on Linux, extras left out) are in the bundle, except the one named as left out."""
    from importlib.metadata import packages_distributions

    carried = {dist.lower() for name in bundle_mod.PACKAGES for dist in packages_distributions().get(name, ())}
    env = {"python_version": "3.11", "sys_platform": "linux", "extra": ""}
    missing = set()
    for dist in ("ansible-core", "pytest", "pytest-testinfra", "jinja2"):
        for line in requires(dist) or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                if req.name.lower() not in carried and req.name.lower() not in bundle_mod.NOT_CARRIED:
                    missing.add(req.name)
    assert not missing


def test_the_mode_is_push_up_to_the_threshold_and_where_pull_is_not_served() -> None:
    assert choose("auto", PULL_ABOVE, True) == "push"
    assert choose("auto", PULL_ABOVE + 1, True) == "pull"
    assert choose("auto", 1000, False) == "push"
    assert choose("pull", 1, True) == "pull" and choose("push", 1000, True) == "push"


# -- the server ------------------------------------------------------------------------------
_SEQ = iter(range(1, 1 << 30))


def _call(url: str, node: str, token: str, body: dict | None = None, key: bytes = b"k" * 32) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"X-Gpuprov-Node": node, "Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    if data is not None:  # signed as the agent signs a batch (tests/unit/test_pull_reports.py)
        seq = next(_SEQ)
        req.add_header("X-Gpuprov-Seq", str(seq))
        req.add_header("X-Gpuprov-Signature", report_signature(report_secret(key, node), seq, data))
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_server_answers_only_a_node_with_its_own_token() -> None:
    key = b"k" * 32
    with PullServer("127.0.0.1", key, b"BUNDLE", "ab" * 32, ["n1"]) as server:
        url = f"{server.base_url}/bundle/{'ab' * 32}"
        assert _call(url, "n1", node_token(key, "n1")) == (200, b"BUNDLE")
        assert _call(url, "n1", "")[0] == 403
        assert _call(url, "n1", node_token(key, "n2"))[0] == 403  # another node's token
        assert _call(url, "n1", node_token(b"x" * 32, "n1"))[0] == 403  # another session's
        assert _call(f"{server.base_url}/bundle/{'cd' * 32}", "n1", node_token(key, "n1"))[0] == 404
        assert server.refused == 3 and server.fetched == {"n1": 1}


def test_a_report_is_kept_once_resent_from_where_it_stopped_and_always_as_its_node() -> None:
    key = b"k" * 32
    with PullServer("127.0.0.1", key, b"B", "ab" * 32, []) as server:
        report = f"{server.base_url}/report"
        token = node_token(key, "n2")
        one = {"event": "runner_on_start", "event_data": {"host": "n1", "task": "t1"}}
        two = {"event": "runner_on_ok", "event_data": {"host": "n2", "task": "t1"}}
        assert json.loads(_call(report, "n2", token, {"from": 0, "events": [one]})[1]) == {"have": 1}
        # The answer was lost: the agent sends both again from 0; the first is not doubled.
        assert json.loads(_call(report, "n2", token, {"from": 0, "events": [one, two]})[1]) == {"have": 2}
        # A gap (events the controller never had) is not taken: the agent resends from 2.
        assert json.loads(_call(report, "n2", token, {"from": 5, "events": [one]})[1]) == {"have": 2}
        assert [e["event_data"]["host"] for e in server.events["n2"]] == ["n2", "n2"]
        assert _call(report, "n2", token, {"nope": 1})[0] == 400


# -- the node agent ------------------------------------------------------------------------------
def _agent():
    return load_agent("gpuprov_pull_agent")


def test_the_agent_refuses_a_bundle_of_another_sha256_and_unpacks_nothing(tmp_path: Path, monkeypatch) -> None:
    agent = _agent()
    monkeypatch.setattr(agent, "STATE", tmp_path / "state")
    key = b"k" * 32
    served = b"not the bundle the launch named"
    expected = "0" * 64
    with PullServer("127.0.0.1", key, served, expected, ["n1"]) as server:
        boot = Boot(bundle_url=f"{server.base_url}/bundle/{expected}", report_url=f"{server.base_url}/report",
                    sha256=expected, key=key)
        config = tmp_path / "pull.json"
        config.write_text(json.dumps(boot.node_config("n1", "docker-node")))
        # "done" tells the controller the token is gone: it must be, when "done" is sent.
        on_done: list[bool] = []
        add = agent.Reporter.add

        def watch(reporter, event: str, **fields) -> None:
            if event == "done":
                on_done.append(config.exists())
            add(reporter, event, **fields)

        monkeypatch.setattr(agent.Reporter, "add", watch)
        assert agent.main(str(config)) == 3
        assert on_done == [False]
        kinds = [e["event"] for e in server.events["n1"]]
    assert kinds == ["agent", "refused", "done"]
    refused = server.events["n1"][1]["event_data"]["msg"]
    assert f"bundle sha256 {hashlib.sha256(served).hexdigest()}, expected {expected}" in refused
    assert not (tmp_path / "state" / expected).exists()  # nothing unpacked
    assert not config.exists()  # the token is gone


def test_the_agent_unpacks_only_files_and_directories_inside_its_directory(tmp_path: Path) -> None:
    agent = _agent()
    for name, kind in (("../escape", tarfile.REGTYPE), ("/etc/passwd", tarfile.REGTYPE),
                       ("link", tarfile.SYMTYPE)):
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc"
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(RuntimeError, match="refused"):
            agent.unpack(raw.getvalue(), tmp_path / "root")
        assert not (tmp_path / "escape").exists()


def test_the_boot_archive_holds_the_agent_its_enabled_unit_and_a_private_config() -> None:
    boot = Boot(bundle_url="http://10.0.0.1:1/bundle/x", report_url="http://10.0.0.1:1/report", sha256="x",
                key=b"k" * 32)
    members = _members_plain(boot.archive("c-node-1", "docker-node"))
    assert members["etc/gpuprov/pull.json"].mode == 0o600
    assert members["etc/gpuprov"].mode == 0o700
    assert members["etc/systemd/system/multi-user.target.wants/gpuprov-pull.service"].linkname == \
        "/etc/systemd/system/gpuprov-pull.service"
    assert members["usr/local/lib/gpuprov/pull-agent.py"].mode == 0o755
    config = boot.node_config("c-node-1", "docker-node")
    assert config["token"] == node_token(b"k" * 32, "c-node-1") != boot.token("c-node-2")
    assert "key" not in json.dumps(config).lower().replace("token", "")  # the session key never leaves


def _members_plain(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_pull_where_it_cannot_run_is_one_line_exit_2_and_creates_nothing(capsys, tmp_path, monkeypatch) -> None:
    from gpuprov.errors import BadInput
    from gpuprov.providers import ClusterSpec, get, options_for
    from gpuprov.pull.mode import mode_for
    from tests.conftest import invoke

    monkeypatch.setenv("GPUPROV_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPUPROV_REGISTRY_PASSWORD", raising=False)
    for args, why in (
        (("--count", "1", "--no-bootstrap"), "--bootstrap pull says how nodes bootstrap; it cannot go with "
                                             "--no-bootstrap"),
        (("--count", "1"), "--bootstrap pull does not carry GPUPROV_REGISTRY_PASSWORD to the nodes"),
    ):
        if "--no-bootstrap" not in args:
            monkeypatch.setenv("GPUPROV_REGISTRY_PASSWORD", "s3cret")
        code, _, err = invoke(capsys, "up", "--provider", "docker", "--name", "np", "--bootstrap", "pull", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and why in err and "s3cret" not in err, err
        assert not (tmp_path / "home" / "clusters" / "np").exists()
    monkeypatch.delenv("GPUPROV_REGISTRY_PASSWORD")
    spec = ClusterSpec(name="np", provider="aws", instance_type="p4d.24xlarge", count=64,
                       options=options_for("aws", {}))
    # AWS pulls through the cluster's S3 bucket (gpuprov/providers/aws/s3.py): asked, and by auto
    # above PULL_ABOVE nodes, as elsewhere; up to it auto pushes.
    assert mode_for("pull", get("aws"), spec, True) == "pull"
    assert mode_for("auto", get("aws"), spec, True) == "pull"
    assert mode_for("auto", get("aws"), dataclasses.replace(spec, count=PULL_ABOVE), True) == "push"
    with pytest.raises(BadInput, match="cannot go with --no-bootstrap"):
        mode_for("pull", get("aws"), spec, False)
    assert mode_for("auto", get("aws"), spec, False) == "push"  # `up --count 64 --no-bootstrap`: nothing to pull
    # Static hosts reached through this machine's loopback (a port forward) could never reach
    # its bundle server: refused before anything is recorded.
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("user: gpuprov\nhosts:\n  - name: rack-1\n    address: 127.0.0.1\n    port: 2222\n")
    spec = ClusterSpec(name="np", provider="static", instance_type=None, count=None,
                       options=options_for("static", {"hosts_file": str(hosts)}))
    with pytest.raises(BadInput, match="through this machine's loopback"):
        mode_for("pull", get("static"), spec, True)
    assert mode_for("auto", get("static"), spec, True) == "push"


def test_auto_counts_a_hosts_files_hosts_and_pushes_where_pull_cannot_run(tmp_path, monkeypatch) -> None:
    """`--bootstrap auto` pulls above PULL_ABOVE nodes: a static cluster's are its hosts file's
    (it takes no --count). Where pull cannot run, auto pushes instead of refusing: hosts behind
    this machine's loopback, a registry password the bundle would not carry."""
    import socket

    from gpuprov.errors import BadInput
    from gpuprov.providers import ClusterSpec, get, options_for
    from gpuprov.pull.mode import mode_for

    monkeypatch.delenv("GPUPROV_REGISTRY_PASSWORD", raising=False)

    def static(address: str) -> ClusterSpec:
        hosts = tmp_path / f"hosts-{address}.yml"
        hosts.write_text("user: gpuprov\nhosts:\n" + "".join(
            f"  - name: rack-{i}\n    address: {address}\n    port: {2200 + i}\n" for i in range(PULL_ABOVE + 1)))
        return ClusterSpec(name="big", provider="static", instance_type=None, count=None,
                           options=options_for("static", {"hosts_file": str(hosts)}))

    assert get("static").bootstrap_count(static("127.0.0.1")) == PULL_ABOVE + 1
    assert mode_for("auto", get("static"), static("127.0.0.1"), True) == "push"  # loopback: pushed
    # Hosts on a routed address (TEST-NET-1): pulled where this machine has a route there, as
    # the static provider finds its own address (the kernel's route choice; no packet is sent).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.10", 9))
            routed = not probe.getsockname()[0].startswith("127.")
    except OSError:
        routed = False
    assert mode_for("auto", get("static"), static("192.0.2.10"), True) == ("pull" if routed else "push")
    aws = ClusterSpec(name="big", provider="aws", instance_type="p4d.24xlarge", count=64,
                      options=options_for("aws", {}))
    monkeypatch.setenv("GPUPROV_REGISTRY_PASSWORD", "s3cret")
    assert mode_for("auto", get("aws"), aws, True) == "push"
    with pytest.raises(BadInput, match="does not carry GPUPROV_REGISTRY_PASSWORD"):
        mode_for("pull", get("aws"), aws, True)


def test_provision_via_pull_is_refused_where_it_cannot_run_before_anything_changes(gpuprov_home, monkeypatch) -> None:
    """`provision --via pull` (gpuprov.core.via_pull.refuse): a cluster that runs Slurm (pull
    never configures it), a registry password the bundle would not carry, hosts behind this
    machine's loopback: one line each, exit 2, before any node is handed anything."""
    from gpuprov.core.via_pull import refuse
    from gpuprov.errors import BadInput
    from gpuprov.providers import ClusterSpec, get
    from gpuprov.state import NodeRecord, Store

    store = Store()
    slurm = store.create_cluster("s1", "docker", {"options": {"scheduler": "slurm"}})
    plain = store.create_cluster("p1", "docker", {})
    spec = ClusterSpec.from_record("p1", "docker", {})
    with pytest.raises(BadInput, match="does not configure Slurm, and s1 runs it"):
        refuse(slurm, get("docker"), spec, [])
    refuse(plain, get("docker"), spec, [])  # local nodes reach the bridge's gateway: pulls
    monkeypatch.setenv("GPUPROV_REGISTRY_PASSWORD", "s3cret")
    with pytest.raises(BadInput, match="does not carry GPUPROV_REGISTRY_PASSWORD"):
        refuse(plain, get("docker"), spec, [])
    monkeypatch.delenv("GPUPROV_REGISTRY_PASSWORD")
    forwarded = NodeRecord(name="rack-1", id="rack-1", address="127.0.0.1", ssh_port=2222, user="gpuprov",
                           state="running", instance_type="")
    with pytest.raises(BadInput, match="through this machine's loopback"):
        refuse(store.create_cluster("st", "static", {}), get("static"), ClusterSpec.from_record("st", "static", {}),
               [forwarded])


def test_a_tags_bundle_names_the_asked_plays_and_the_agent_runs_only_those(built, tmp_path: Path) -> None:
    """As push runs a site run with --tags (gpuprov.ansible.runner.site_plays_for): the bundle
    names the asked plays' playbooks, the agent runs them in place of site.yml, and refuses a
    name its site.yml does not import; a whole-site bundle names none."""
    agent = load_agent("agent_for_plays")
    manifest = json.loads(_read(built.data, "manifest.json"))
    assert manifest["plays"] == ["spot.yml"]
    with tarfile.open(fileobj=io.BytesIO(built.data), mode="r:gz") as tar:
        tar.extractall(tmp_path, filter="data")
    assert agent.plays(tmp_path, manifest) == [tmp_path / "site" / "playbooks" / "spot.yml"]
    for bad in (["../../etc/passwd"], ["patch.yml"], "spot.yml", [7]):
        with pytest.raises(RuntimeError, match=re.escape("not playbooks its site.yml imports")):
            agent.plays(tmp_path, {**manifest, "plays": bad})
    whole = bundle_mod.build(lock={"hash": "abc123"}, extravars={}, group="gpuprov_nodes", group_vars={},
                             profiles={}, tags=())
    assert "plays" not in json.loads(_read(whole.data, "manifest.json"))
    assert agent.plays(tmp_path, {"tags": []}) == []
