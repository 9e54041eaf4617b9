"""`gpuprov ssh`, `ssh-config` and `exec --node/--controller` (gpuprov/core/login.py): the ssh
command line, word for word; which node a command picks; the ~/.ssh/config text, line for line;
and every value that would have become an option or a line, refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuprov.core import login
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.ssh import USER_KEYS
from gpuprov.state import ClusterRecord, NodeRecord

FILES = ClusterFiles(Path("/state/clusters/demo"))
KEY = "/state/clusters/demo/id_ed25519"
KNOWN = "/state/clusters/demo/known_hosts"


def node(i: int, **changes) -> NodeRecord:
    base = NodeRecord(name=f"demo-node-{i}", id=f"c{i}", address="127.0.0.1", ssh_port=2200 + i, user="root",
                      state="running", zone="local", instance_type="docker-node")
    return dataclasses.replace(base, **changes)


def cluster(count: int = 3, **options) -> ClusterRecord:
    return ClusterRecord(name="demo", provider="docker", created="2026-12-01T00:00:00+00:00", state="verified",
                         spec={"options": options}, lock=None, nodes=tuple(node(i) for i in range(1, count + 1)))


SLURM = {"scheduler": "slurm"}


# -- the ssh command line ------------------------------------------------------------------------
def test_a_login_is_sshs_options_then_dashes_then_the_destination() -> None:
    assert login.ssh_argv(node(1), FILES) == [
        "ssh", "-p", "2201",
        "-o", f"UserKnownHostsFile={KNOWN}", "-o", "StrictHostKeyChecking=yes",
        "-o", "IdentitiesOnly=yes", "-i", KEY,
        "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
        "--", "root@127.0.0.1",
    ]


def test_a_command_follows_the_destination_as_one_shell_line() -> None:
    tail = login.ssh_argv(node(1), FILES, ["sbatch", "--wrap", "srun hostname"])[-3:]
    assert tail == ["--", "root@127.0.0.1", "sbatch --wrap 'srun hostname'"]
    # One word is a shell line as it is (as `exec` takes it); a word like an option stays the command's.
    assert login.ssh_argv(node(1), FILES, ["squeue; sinfo"])[-1] == "squeue; sinfo"
    assert login.ssh_argv(node(1), FILES, ["-oProxyCommand=x"])[-3:] == ["--", "root@127.0.0.1", "-oProxyCommand=x"]


def test_a_nodes_own_key_is_used_and_a_static_host_without_one_uses_the_agent() -> None:
    own = login.ssh_argv(node(1, zone="static", extra={"key_file": "/keys/ops"}), FILES)
    assert own[own.index("-i") + 1] == "/keys/ops"
    # A static host without a key, as the static provider records it (login: the user's keys).
    agent = login.ssh_argv(node(1, zone="static", user="ops", address="10.0.0.5", ssh_port=22,
                                extra={"login": USER_KEYS}), FILES)
    assert agent == ["ssh", "-p", "22", "-o", f"UserKnownHostsFile={KNOWN}", "-o", "StrictHostKeyChecking=yes",
                     "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                     "--", "ops@10.0.0.5"]


@pytest.mark.parametrize("words", [[""], ["   "], ["", "hostname"]])
def test_an_empty_command_is_refused_not_a_login(words: list[str]) -> None:
    with pytest.raises(BadInput, match="an empty command"):
        login.ssh_argv(node(1), FILES, words)
    with pytest.raises(BadInput, match="an empty command"):
        login.command_line(words)


def test_a_port_recorded_as_text_reaches_ssh_as_a_number() -> None:
    assert login.ssh_argv(node(1, ssh_port="2201 "), FILES)[:3] == ["ssh", "-p", "2201"]
    assert "    Port 2201" in login.host_block(node(1, ssh_port=" 2201"), FILES)


def test_an_empty_word_after_the_command_is_the_commands() -> None:
    assert login.command_line(["printf", "%s", ""]) == "printf %s ''"


# -- which node ---------------------------------------------------------------------------------
def test_the_default_node_is_the_slurm_controller_else_the_first() -> None:
    assert login.login_node(cluster(), None) == "demo-node-1"
    assert login.login_node(cluster(**SLURM), None) == "demo-node-1"
    assert login.login_node(cluster(**SLURM, slurm_controller="demo-node-3"), None) == "demo-node-3"
    assert login.login_node(cluster(**SLURM, slurm_controller="demo-node-3"), "demo-node-2") == "demo-node-2"


def test_an_unknown_node_names_the_closest_and_the_clusters_nodes() -> None:
    with pytest.raises(BadInput) as exc:
        login.login_node(cluster(), "demo-node-4")
    assert str(exc.value) == ("cluster 'demo' has no node 'demo-node-4'; did you mean demo-node-3? "
                              "(its nodes: demo-node-1, demo-node-2, demo-node-3)")
    with pytest.raises(BadInput) as exc:
        login.login_node(cluster(), "-oProxyCommand=x\n")
    assert str(exc.value) == ("cluster 'demo' has no node '-oProxyCommand=x\\n' "
                              "(its nodes: demo-node-1, demo-node-2, demo-node-3)")


def test_a_fleets_unknown_node_counts_the_rest() -> None:
    with pytest.raises(BadInput, match=r"'gpu-7' \(its nodes: demo-node-1, demo-node-2, .*, demo-node-8 and 4 more\)$"):
        login.login_node(cluster(12), "gpu-7")


def test_a_cluster_without_nodes_has_none_to_log_in_to() -> None:
    with pytest.raises(BadInput, match="cluster 'demo' has no nodes to log in to"):
        login.login_node(cluster(0), None)


def test_exec_picks_the_nodes_named_the_controller_or_every_node() -> None:
    assert login.exec_nodes(cluster(), (), False) is None
    assert login.exec_nodes(cluster(), ("demo-node-3", "demo-node-1", "demo-node-3"), False) == [
        "demo-node-1", "demo-node-3"]
    assert login.exec_nodes(cluster(**SLURM, slurm_controller="demo-node-2"), (), True) == ["demo-node-2"]
    assert login.exec_nodes(cluster(**SLURM), (), True) == ["demo-node-1"]


@pytest.mark.parametrize(("asked", "on_controller", "needle"), [
    (("demo-node-9",), False, "cluster 'demo' has no node 'demo-node-9'"),
    ((), True, "cluster 'demo' runs no Slurm, so it has no controller"),
    (("demo-node-1",), True, "--node and --controller: give one of them"),
])
def test_exec_refuses_a_node_it_cannot_pick(asked: tuple[str, ...], on_controller: bool, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        login.exec_nodes(cluster(), asked, on_controller)


# -- ~/.ssh/config -------------------------------------------------------------------------------
def test_a_host_entry_is_named_as_the_node() -> None:
    assert login.host_block(node(2), FILES) == [
        "",
        "Host demo-node-2",
        "    HostName 127.0.0.1",
        "    Port 2202",
        "    User root",
        f"    IdentityFile {KEY}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {KNOWN}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
    ]


def test_a_static_host_without_a_key_gets_no_identity_lines() -> None:
    assert login.host_block(node(1, zone="static", user="ops", address="gpu01.example.org", ssh_port=22,
                                 extra={"login": USER_KEYS}), FILES) == [
        "", "Host demo-node-1", "    HostName gpu01.example.org", "    Port 22", "    User ops",
        f"    UserKnownHostsFile {KNOWN}", "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes"]


REFUSED = [
    ({"name": "demo node"}, "invalid host name"),
    ({"name": "demo-*"}, "invalid host name"),
    ({"name": "-oProxyCommand=x"}, "invalid host name"),
    ({"name": "demo-node-1\nProxyCommand x"}, "invalid host name"),
    ({"user": "root\n    ProxyCommand x"}, "invalid user"),
    ({"user": "-oProxyCommand=x"}, "invalid user"),
    ({"user": "ro ot"}, "invalid user"),
    ({"address": "127.0.0.1 ProxyCommand=x"}, "invalid address"),
    ({"address": "-oProxyCommand=x"}, "invalid address"),
    ({"address": "host\n"}, "invalid address"),
    ({"address": "fe80::1%eth0"}, "holds '%'"),
    ({"ssh_port": 0}, "not a number from 1 to 65535"),
    ({"ssh_port": "22 -oProxyCommand=x"}, "not a number from 1 to 65535"),
    ({"extra": {"key_file": "/keys/my key"}}, "holds ' '"),
    ({"extra": {"key_file": "/keys/k\tProxyCommand x"}}, "holds '\\\\t'"),
    ({"extra": {"key_file": "/keys/k\nProxyCommand x"}}, "holds '\\\\n'"),
    ({"extra": {"key_file": '/keys/"k"'}}, "holds '\"'"),
    ({"extra": {"key_file": "/keys/k'"}}, "holds \"'\""),
    ({"extra": {"key_file": "/keys/k#1"}}, "holds '#'"),
    ({"extra": {"key_file": "/keys/k=1"}}, "holds '='"),
    ({"extra": {"key_file": "/keys/%d/k"}}, "holds '%'"),
    ({"extra": {"key_file": "/keys/${HOME}/k"}}, "holds '\\$'"),
    ({"extra": {"key_file": "/keys/k\x1b[2J"}}, "holds '\\\\x1b'"),
    ({"extra": {"key_file": "/keys/k\u2028x"}}, "holds '\\\\u2028'"),
]


@pytest.mark.parametrize(("changes", "needle"), REFUSED)
def test_a_value_that_is_not_one_plain_word_is_refused(changes: dict, needle: str) -> None:
    bad = node(1, **changes)
    with pytest.raises(BadInput, match=needle):
        login.host_block(bad, FILES)
    if "holds '%'" not in needle or "key_file" in changes.get("extra", {}):
        with pytest.raises(BadInput, match=needle):
            login.ssh_argv(bad, FILES)


@pytest.mark.parametrize("state", ["/state dir", "/state#1", "/state=x", "/st\"ate", "/state/%h"])
def test_a_state_directory_that_would_need_quoting_is_refused(state: str) -> None:
    files = ClusterFiles(Path(state) / "clusters" / "demo")
    with pytest.raises(BadInput, match=r"demo-node-1: key: .* ssh reads a value"):
        login.host_block(node(1), files)
    with pytest.raises(BadInput, match=r"demo-node-1: key: .* ssh reads a value"):
        login.ssh_argv(node(1), files)


def test_a_link_local_address_with_its_zone_reaches_ssh_as_the_destination() -> None:
    assert login.ssh_argv(node(1, address="fe80::1%eth0"), FILES)[-1] == "root@fe80::1%eth0"


# -- as OpenSSH reads them (ssh -G: the options it would use, no connection) ------------------------
def _as_openssh_reads(argv: list[str]) -> dict[str, list[str]]:
    import shutil
    import subprocess

    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client on this machine")
    proc = subprocess.run(argv, capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL, timeout=30)
    read: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        read.setdefault(key, []).append(value)
    return read


WANTED = ("hostname", "port", "user", "identityfile", "identitiesonly", "userknownhostsfile",
          "globalknownhostsfile", "stricthostkeychecking")


def test_openssh_reads_the_login_and_the_config_block_alike(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path / "clusters" / "demo")
    files.dir.mkdir(parents=True)
    files.key.write_text("not a key; ssh -G only checks that it is there\n")
    argv = login.ssh_argv(node(2), files, ["hostname"])
    from_argv = _as_openssh_reads(["ssh", "-G", "-F", "/dev/null", *argv[1:]])
    config = tmp_path / "config"
    config.write_text("\n".join(login.host_block(node(2), files)) + "\n")
    from_config = _as_openssh_reads(["ssh", "-G", "-F", str(config), "demo-node-2"])
    expected = {"hostname": ["127.0.0.1"], "port": ["2202"], "user": ["root"], "identityfile": [str(files.key)],
                "identitiesonly": ["yes"], "userknownhostsfile": [str(files.known_hosts)],
                "globalknownhostsfile": ["/dev/null"], "stricthostkeychecking": ["true"]}
    assert {k: from_argv.get(k) for k in WANTED} == expected
    assert {k: from_config.get(k) for k in WANTED} == expected
    assert from_argv["controlmaster"] == ["false"] and "controlpath" not in from_argv
