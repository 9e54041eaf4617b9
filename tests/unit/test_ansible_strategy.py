"""Which strategy the generated ansible.cfg gives Ansible: its own linear strategy by default,
Mitogen for Ansible's with GPUPROV_ANSIBLE_STRATEGY=mitogen; anything else is refused before a
file is written. Either way a changed host key is named as such."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from gpuprov import ssh
from gpuprov.ansible.inventory import render, strategy_plugins
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.state import NodeRecord

# What ansible-playbook printed with Mitogen's strategy when the node's host key was replaced
# (a local node, 2026-11-26; the cluster's known_hosts pinned the old key).
MITOGEN_MISMATCH = ("Task failed: Host key checking is enabled, and SSH reported an unrecognized or "
                    "mismatching host key.")


def _nodes() -> list[NodeRecord]:
    return [NodeRecord(name="c1-node-1", id="abc1", address="127.0.0.1", ssh_port=32001, user="gpuprov",
                       state="running", zone="local", instance_type="docker-node")]


def _cfg(tmp_path: Path) -> configparser.ConfigParser:
    files = ClusterFiles(tmp_path)
    render("c1", "docker", _nodes(), {}, files)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(files.ansible_cfg)
    return parser


def test_ansibles_own_strategy_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPROV_ANSIBLE_STRATEGY", raising=False)
    assert strategy_plugins() is None
    defaults = _cfg(tmp_path)["defaults"]
    assert "strategy" not in defaults and "strategy_plugins" not in defaults


def test_mitogen_on_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_ANSIBLE_STRATEGY", "mitogen")
    defaults = _cfg(tmp_path)["defaults"]
    assert defaults["strategy"] == "mitogen_linear"
    assert (Path(defaults["strategy_plugins"]) / "mitogen_linear.py").is_file()
    # Host key checking stays on, as with Ansible's strategy.
    assert defaults["host_key_checking"] == "True"


def test_another_strategy_is_refused_before_anything_is_written(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPROV_ANSIBLE_STRATEGY", "free; rm -rf /")
    files = ClusterFiles(tmp_path)
    with pytest.raises(BadInput, match="GPUPROV_ANSIBLE_STRATEGY"):
        render("c1", "docker", _nodes(), {}, files)
    assert not files.ansible_cfg.exists() and not files.inventory.exists()


def test_mitogens_words_for_a_changed_host_key_are_named_as_such() -> None:
    assert ssh.ssh_error_line(MITOGEN_MISMATCH).startswith(ssh.HOST_KEY_MISMATCH)


def test_a_bad_strategy_is_one_line_and_exit_2_before_up_launches_anything(monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprov.cli.app import main

    monkeypatch.setenv("GPUPROV_ANSIBLE_STRATEGY", "free")
    with pytest.raises(SystemExit) as exc:
        main(["up", "--provider", "docker", "--count", "1", "--name", "never", "--yes"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "GPUPROV_ANSIBLE_STRATEGY='free'" in err
