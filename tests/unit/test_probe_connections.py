"""The probes multiplex their commands to a node (gpuprov/probes/run.py ``control_dir``).

testinfra's ansible backend adds ``-o ControlPath=...`` to its ssh commands only when the
directory the cluster's ansible.cfg names exists; without it every probe command is a whole SSH
connection. Mitogen (the e2e units' strategy) never makes that directory, nor does a cluster
just launched. These tests render the real ansible.cfg template and ask testinfra's own
inventory reader which ssh command it would run.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from testinfra.utils.ansible_runner import get_ansible_config, get_ansible_host

from gpuprov import templating
from gpuprov.probes.run import control_dir


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(templating.render("ansible.cfg.j2", {
        "cluster": "c1", "forks": 5, "inventory": str(tmp_path / "inventory.yml"),
        "roles_path": str(tmp_path / "roles"), "strategy_plugins": None}))
    monkeypatch.setenv("ANSIBLE_CONFIG", str(cfg))
    return cfg


def _ssh_command(cfg: Path) -> str:
    """The ssh command testinfra builds for a node of an inventory (``ansible-inventory --list``'s
    form) under ``cfg`` (read from ANSIBLE_CONFIG, as its backend does)."""
    assert Path(os.environ["ANSIBLE_CONFIG"]) == cfg
    inventory = {"all": {"hosts": ["n1"]}, "_meta": {"hostvars": {"n1": {
        "ansible_host": "127.0.0.1", "ansible_port": 2222, "ansible_user": "gpuprov",
        "ansible_become": True, "ansible_ssh_private_key_file": "/k"}}}}
    host = get_ansible_host(get_ansible_config(), inventory, "n1")
    cmd, args = host.backend._build_ssh_command("true")
    return " ".join(cmd) % tuple(args)


def test_without_the_directory_testinfra_opens_a_connection_per_command(cluster: Path) -> None:
    # What a probe run did under Mitogen before control_dir: ControlMaster asked, no path for it.
    assert "ControlMaster=auto" in _ssh_command(cluster)
    assert "ControlPath=" not in _ssh_command(cluster)


def test_the_probes_make_the_clusters_own_directory_private_and_testinfra_uses_it(cluster: Path) -> None:
    made = control_dir(cluster)
    home = Path.home()
    assert made == home / ".ansible" / "cp" / "c1"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert f"-o ControlPath={made}/%C" in _ssh_command(cluster)
    # Again: kept as it is (a live master's socket stays).
    (made / "sock").touch()
    assert control_dir(cluster) == made and (made / "sock").exists()


def test_a_config_without_the_setting_makes_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nforks = 5\n")
    assert control_dir(cfg) is None


@pytest.mark.parametrize(("hosts", "cpus", "workers"), [
    (1, 2, 1), (2, 2, 1), (3, 2, 1), (4, 2, 2), (8, 2, 2), (8, 16, 4), (16, 16, 8), (64, 64, 8)])
def test_probe_workers_one_per_two_nodes_within_the_cpus(hosts: int, cpus: int, workers: int) -> None:
    from gpuprov.probes.run import probe_workers

    assert probe_workers(hosts, cpus) == workers
