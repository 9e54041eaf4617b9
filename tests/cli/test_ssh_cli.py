"""`gpuprov ssh`, `gpuprov ssh-config` and `gpuprov exec --node/--controller` through the entry
point: exit codes, the one line of bad input, and what reaches ssh (no sshd, no Docker: ssh
itself and fabric are stood in for)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuprov import ssh
from gpuprov.cluster import files_for
from gpuprov.core import login
from gpuprov.state import NodeRecord, Store
from tests.conftest import invoke


def _rack(name: str = "rack", /, options: dict | None = None, pin: bool = True, **first) -> Path:
    """A static cluster of two hosts (the first's fields changed by ``first``), their host keys
    pinned (``pin``: the first's too); its directory. A static cluster's provider asks nothing
    of the network."""
    store = Store()
    store.create_cluster(name, "static", {"options": options or {}})
    nodes = [NodeRecord(name=f"{name}-{i}", id=f"{name}-{i}", address=f"192.0.2.{i}", ssh_port=2200 + i, user="ops",
                        state="reachable", zone="static", extra={"key_file": f"/keys/{name}-{i}"})
             for i in (1, 2)]
    nodes[0] = NodeRecord(**{**nodes[0].__dict__, **first})
    store.replace_nodes(name, nodes)
    files = files_for(name)
    ssh.pin_host_keys(files.known_hosts, {(n.address, n.ssh_port): f"ssh-ed25519 KEY{i}"
                                          for i, n in enumerate(nodes) if pin or i})
    return files.dir


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """What gpuprov handed to ssh: ("exec", argv) for a login, ("run", argv) for a command (exit 7)."""
    calls: list[tuple[str, list[str]]] = []

    def execvp(file: str, argv: list[str]) -> None:
        calls.append(("exec", argv))
        raise SystemExit(0)  # execvp never returns

    def run(argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        calls.append(("run", argv))
        return subprocess.CompletedProcess(argv, 7)

    monkeypatch.setattr(login.os, "execvp", execvp)
    monkeypatch.setattr(login.subprocess, "run", run)
    return calls


def _bad_input(code: int, out: str, err: str, line: str) -> None:
    assert (code, out, err) == (2, "", f"gpuprov: {line}\n")


def _argv(directory: Path, node: int, *command: str) -> list[str]:
    return ["ssh", "-p", f"220{node}", "-o", f"UserKnownHostsFile={directory}/known_hosts",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-i", f"/keys/rack-{node}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "--", f"ops@192.0.2.{node}", *command]


# -- gpuprov ssh ---------------------------------------------------------------------------------
def test_a_login_replaces_gpuprov_with_ssh(capsys, gpuprov_home: Path, ran) -> None:
    directory = _rack()
    assert invoke(capsys, "ssh", "rack") == (0, "", "")
    assert invoke(capsys, "ssh", "rack", "rack-2", "--") == (0, "", "")
    assert ran == [("exec", _argv(directory, 1)), ("exec", _argv(directory, 2))]


def test_a_command_exits_with_its_exit_code(capsys, gpuprov_home: Path, ran) -> None:
    directory = _rack()
    assert invoke(capsys, "ssh", "rack", "rack-2", "--", "sbatch", "--wrap", "srun hostname") == (7, "", "")
    # After --, a word is the command's even where it could be NODE or an option.
    assert invoke(capsys, "ssh", "rack", "--", "rack-2", "-v") == (7, "", "")
    assert ran == [("run", _argv(directory, 2, "sbatch --wrap 'srun hostname'")),
                   ("run", _argv(directory, 1, "rack-2 -v"))]


def test_a_slurm_cluster_logs_in_to_its_controller(capsys, gpuprov_home: Path, ran) -> None:
    directory = _rack(options={"scheduler": "slurm", "slurm_controller": "rack-2"})
    assert invoke(capsys, "ssh", "rack", "--", "sinfo") == (7, "", "")
    assert ran == [("run", _argv(directory, 2, "sinfo"))]


@pytest.mark.parametrize(("args", "line"), [
    (["rack-3"], "cluster 'rack' has no node 'rack-3'; did you mean rack-2? (its nodes: rack-1, rack-2)"),
    (["-p"], "No such option '-p'. (see 'gpuprov ssh --help')"),
    (["rack-1", "--", ""], "an empty command ('') after --: give the command to run"),
    (["--", "", "hostname"], "an empty command ('') after --: give the command to run"),
    (["rack-1", "hostname"], "Got unexpected extra argument (hostname) (see 'gpuprov ssh --help')"),
])
def test_bad_input_runs_nothing(capsys, gpuprov_home: Path, ran, args: list[str], line: str) -> None:
    _rack()
    _bad_input(*invoke(capsys, "ssh", "rack", *args), line)
    assert ran == []


def test_an_unknown_cluster_is_bad_input(capsys, gpuprov_home: Path, ran) -> None:
    _bad_input(*invoke(capsys, "ssh", "nosuch"), "unknown cluster 'nosuch'; `gpuprov list` shows the clusters")


def test_a_record_that_would_become_an_option_is_refused(capsys, gpuprov_home: Path, ran) -> None:
    _rack(user="-oProxyCommand=x")
    _bad_input(*invoke(capsys, "ssh", "rack"), "rack-1: user: invalid user '-oProxyCommand=x' (a POSIX user "
               "name: letters, digits, '_', '.', '-', not starting with '-')")
    assert ran == []


def test_a_stopped_node_or_one_without_a_pinned_key_is_not_reached(capsys, gpuprov_home: Path, ran) -> None:
    _rack(state="stopped")
    assert invoke(capsys, "ssh", "rack") == (1, "", "gpuprov: node(s) not running: rack-1\n")
    directory = _rack("lab", pin=False)
    code, out, err = invoke(capsys, "ssh", "lab")
    assert (code, out) == (1, "")
    assert err == (f"gpuprov: lab-1: no host key is pinned for 192.0.2.1:2201 in {directory}/known_hosts; "
                   "refused, nothing ran (`gpuprov up lab` pins it)\n")
    assert ran == []


# -- gpuprov ssh-config ----------------------------------------------------------------------------
def test_ssh_config_prints_a_host_per_node(capsys, gpuprov_home: Path) -> None:
    directory = _rack()
    code, out, err = invoke(capsys, "ssh-config", "rack")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "# gpuprov cluster rack: its nodes, their pinned host keys (gpuprov ssh-config rack)",
        *[line for i in (1, 2) for line in [
            "", f"Host rack-{i}", f"    HostName 192.0.2.{i}", f"    Port 220{i}", "    User ops",
            f"    IdentityFile /keys/rack-{i}", "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {directory}/known_hosts", "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes"]]]
    assert out.endswith("StrictHostKeyChecking yes\n")


@pytest.mark.parametrize(("first", "line"), [
    ({"extra": {"key_file": "/keys/a key"}},
     "rack-1: key: '/keys/a key' holds ' ': ssh reads a value as config text, where only letters, digits "
     "and _ . / : @ + - stand for themselves; refused, nothing printed or run"),
    ({"address": "fe80::1%eth0"},
     "rack-1: address: 'fe80::1%eth0' holds '%': ssh reads a value as config text, where only letters, digits "
     "and _ . / : @ + - stand for themselves; refused, nothing printed or run"),
    ({"name": "rack 1"}, "node: invalid host name 'rack 1' (letters, digits, '.', '_', '-')"),
])
def test_ssh_config_prints_nothing_for_a_value_that_would_add_a_line(capsys, gpuprov_home: Path, first: dict,
                                                                      line: str) -> None:
    _rack(**first)
    _bad_input(*invoke(capsys, "ssh-config", "rack"), line)


# -- gpuprov exec --node / --controller ---------------------------------------------------------------
@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes `exec` connected to, through a stand-in for fabric's Connection."""
    import fabric

    hosts: list[str] = []

    class Connection:
        def __init__(self, host: str, **_: object) -> None:
            hosts.append(host)
            self.client = SimpleNamespace(get_host_keys=dict, load_host_keys=lambda path: None,
                                          set_missing_host_key_policy=lambda policy: None)

        def run(self, line: str, **_: object) -> SimpleNamespace:
            return SimpleNamespace(exited=0)

        def close(self) -> None:
            pass

    monkeypatch.setattr(fabric, "Connection", Connection)
    return hosts


def test_exec_runs_on_the_nodes_named_or_the_controller(capsys, gpuprov_home: Path, reached) -> None:
    _rack()
    _rack("hpc", options={"scheduler": "slurm", "slurm_controller": "hpc-2"})
    assert invoke(capsys, "exec", "rack", "--node", "rack-2", "--", "hostname")[0] == 0
    assert invoke(capsys, "exec", "hpc", "--controller", "--", "sbatch", "--wrap", "hostname")[0] == 0
    assert invoke(capsys, "exec", "rack", "--", "true")[0] == 0
    assert reached[:2] == ["192.0.2.2", "192.0.2.2"] and sorted(reached[2:]) == ["192.0.2.1", "192.0.2.2"]


@pytest.mark.parametrize(("args", "line"), [
    (["--node", "rack-9", "--", "true"], "cluster 'rack' has no node 'rack-9'; did you mean rack-2? "
     "(its nodes: rack-1, rack-2)"),
    (["--controller", "--", "true"], "cluster 'rack' runs no Slurm, so it has no controller; "
     "name a node instead (--node NODE)"),
    (["--controller", "--node", "rack-1", "--", "true"], "--node and --controller: give one of them"),
    (["--", ""], "an empty command ('') after --: give the command to run"),
])
def test_exec_bad_input_reaches_no_node(capsys, gpuprov_home: Path, reached, args: list[str], line: str) -> None:
    _rack()
    _bad_input(*invoke(capsys, "exec", "rack", *args), line)
    assert reached == []
