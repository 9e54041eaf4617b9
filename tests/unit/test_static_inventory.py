"""Hosts files read by Ansible's own parser (issue 31, item 3): what ansible-inventory reads
is what gpuprov reads; gpuprov's keys are checked against a schema that names the closest
known key; errors keep their place in the file; no setting turns the read into running code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.errors import BadInput
from gpuprov.providers.static import parse_hosts_file

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).parents[2]


def _ansible_inventory(path: Path) -> dict:
    """The real `ansible-inventory --list` on the file, from a folder with no ansible.cfg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(path), "--list"],
                          capture_output=True, text=True, check=True, cwd=path.parent, env=env)
    return json.loads(proc.stdout)


def test_ini_group_vars_reach_only_their_groups_hosts_as_ansible_inventory_reads_them(tmp_path: Path) -> None:
    """Before: every [g:vars] reached every host (dgx1 got gpu's port and user)."""
    f = tmp_path / "rack.ini"
    f.write_text("""
[gpu]
node1 ansible_host=192.0.2.10
node2 ansible_host=192.0.2.11 gpuprov_gpus=8

[dgx]
dgx1 ansible_host=192.0.2.20 gpuprov_instance_type=dgx-a100

[rack:children]
gpu
dgx

[gpu:vars]
ansible_user=root
ansible_port=2222

[rack:vars]
ansible_user=ops
""")
    hosts, _ = parse_hosts_file(str(f))
    hostvars = _ansible_inventory(f)["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(h.name for h in hosts)
    for h in hosts:
        hv = hostvars[h.name]
        assert (h.address, h.user, h.port) == (hv["ansible_host"], hv["ansible_user"], hv.get("ansible_port", 22)), h
        assert h.gpus == hv.get("gpuprov_gpus") and h.instance_type == hv.get("gpuprov_instance_type")
        # Plain values, not Ansible's tagged ones.
        assert type(h.address) is str and type(h.user) is str and type(h.port) is int
    assert {h.name: (h.user, h.port) for h in hosts} == {
        "node1": ("root", 2222), "node2": ("root", 2222), "dgx1": ("ops", 22)}


@pytest.mark.parametrize(("suffix", "text"), [
    (".ini", "[gpu]\ngpu[01:04] ansible_user=ops gpuprov_gpus=8\n"),
    (".yml", "all:\n  hosts:\n    gpu[01:04]:\n      ansible_user: ops\n      gpuprov_gpus: 8\n"),
])
def test_a_host_range_is_four_hosts(tmp_path: Path, suffix: str, text: str) -> None:
    """Before: `gpu[01:04]` was refused as an invalid host name."""
    f = tmp_path / f"range{suffix}"
    f.write_text(text)
    hosts, _ = parse_hosts_file(str(f))
    assert [(h.name, h.address, h.user, h.gpus) for h in hosts] == [
        (f"gpu0{i}", f"gpu0{i}", "ops", 8) for i in range(1, 5)]
    assert sorted(_ansible_inventory(f)["_meta"]["hostvars"]) == [h.name for h in hosts]


GPUPROV_YAML = "hosts:\n  - name: gpu01\n    user: ubuntu\n    address: 192.0.2.1\n"


@pytest.mark.parametrize(("suffix", "text", "message"), [
    # gpuprov's YAML: every key is gpuprov's.
    (".yml", "hosts:\n  - name: gpu01\n    user: ubuntu\n    adress: 192.0.2.1\n",
     "host gpu01: unknown key adress: did you mean address?"),
    (".yml", "hosts:\n  - name: gpu01\n    usr: ubuntu\n", "host gpu01: unknown key usr: did you mean user?"),
    (".yml", GPUPROV_YAML + "    prot: 2222\n", "unknown key prot: did you mean port?"),
    (".yml", GPUPROV_YAML + "    gpsu: 8\n", "unknown key gpsu: did you mean gpus?"),
    (".yml", GPUPROV_YAML + "    instance_typ: dgx-a100\n",
     "unknown key instance_typ: did you mean instance_type?"),
    (".yml", GPUPROV_YAML + "    host_kye: ssh-ed25519 AAAA\n", "unknown key host_kye: did you mean host_key?"),
    (".yml", "usr: ubuntu\n" + GPUPROV_YAML, r"hosts\.yml: unknown key usr: did you mean user\?"),
    (".yml", "known_host: /x\n" + GPUPROV_YAML, "unknown key known_host: did you mean known_hosts?"),
    # Ansible inventories: gpuprov_* names and near misses of gpuprov's names.
    (".ini", "[gpu]\ngpu01 ansible_user=ops adress=192.0.2.1\n",
     "host gpu01: unknown key adress: did you mean address?"),
    (".ini", "[gpu]\ngpu01 ansible_user=ops instance_typ=dgx-a100\n",
     "unknown key instance_typ: did you mean instance_type?"),
    (".ini", "[gpu]\ngpu01 ansible_user=ops gpuprov_gpu=8\n", "unknown key gpuprov_gpu: did you mean gpuprov_gpus?"),
    (".ini", "[gpu]\ngpu01 ansible_user=ops ansible_hots=192.0.2.1\n",
     "unknown key ansible_hots: did you mean ansible_host?"),
    (".ini", "[gpu]\ngpu01 ansible_host=192.0.2.1\n[gpu:vars]\nuesr=ops\n", "unknown key uesr: did you mean user?"),
    (".yml", "all:\n  hosts:\n    gpu01: {ansible_user: ops, gpsu: 8}\n", "unknown key gpsu: did you mean gpus?"),
])
def test_a_typo_of_a_gpuprov_key_is_refused_with_the_closest_known_key(
        tmp_path: Path, suffix: str, text: str, message: str) -> None:
    """Before: typos were ignored (an `adress` host was reached at its name)."""
    f = tmp_path / f"hosts{suffix}"
    f.write_text(text)
    with pytest.raises(BadInput, match=message) as err:
        parse_hosts_file(str(f))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("name", "text"), [
    ("hosts.yml", "hosts:\n  - name: n1\n    address: 192.0.2.1\n    user: ops\n"),
    ("hosts.ini", "[gpu]\nn1 ansible_host=192.0.2.1 ansible_user=ops\n"),
])
def test_a_hosts_file_named_relative_to_the_working_directory_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    # `gpuprov up --hosts hosts.yml` from the file's folder (Ansible's loader wants absolute paths).
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    hosts, _ = parse_hosts_file(name)
    assert [(h.name, h.address, h.user) for h in hosts] == [("n1", "192.0.2.1", "ops")]


def test_ansible_and_user_variables_are_left_alone(tmp_path: Path) -> None:
    f = tmp_path / "hosts.ini"
    f.write_text("[gpu]\ngpu01 ansible_host=192.0.2.1 ansible_ssh_user=ops ansible_become=true rack=3\n")
    assert [(h.address, h.user) for h in parse_hosts_file(str(f))[0]] == [("192.0.2.1", "ops")]


@pytest.mark.parametrize(("name", "text", "where"), [
    ("inv.yml", "all:\n  hosts:\n    a: {ansible_host: 1.2.3.4\n  vars: x\n", "(line 4, column 7)"),
    ("hosts.yml", "user: ubuntu\nhosts:\n  - name: a\n   address: 1.2.3.4\n", "(line 4, column 4)"),
])
def test_a_malformed_yaml_file_keeps_line_and_column(tmp_path: Path, name: str, text: str, where: str) -> None:
    """Before: 'malformed: while parsing a flow mapping', no place in the file."""
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(BadInput, match="is malformed") as err:
        parse_hosts_file(str(f))
    assert str(err.value).endswith(where), err.value


def test_a_malformed_ini_file_is_refused_with_ansibles_reason_and_line(tmp_path: Path) -> None:
    """Before: an unknown section type was read as a group of hosts."""
    f = tmp_path / "hosts.ini"
    f.write_text("[gpu]\nnode1 ansible_user=x\n\n[gpu:bogus]\nnode2 ansible_user=x\n")
    with pytest.raises(BadInput, match=r"\(ini inventory\): Section \[gpu:bogus\] has unknown type: bogus \(line 4\)"):
        parse_hosts_file(str(f))


def _read_in_a_fresh_process(path: Path, env_extra: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """ansible.cfg and ANSIBLE_* are read once per process: a fresh one sees these."""
    code = ("import sys\nfrom gpuprov.providers.static import parse_hosts_file\nfrom gpuprov.errors import GpuprovError\n"
            "try:\n    hosts, _ = parse_hosts_file(sys.argv[1])\nexcept GpuprovError as e:\n"
            "    print(e)\n    sys.exit(2)\nprint(' '.join(f'{h.name}@{h.user}' for h in hosts))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), **env_extra}
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          check=False, cwd=cwd, env=env, timeout=60)


def test_no_setting_turns_on_a_plugin_that_runs_the_hosts_file(tmp_path: Path) -> None:
    """An executable hosts file that is also a shell script: Ansible's script plugin, enabled by
    ANSIBLE_INVENTORY_ENABLED or an ansible.cfg, would run it; gpuprov reads it as INI only."""
    marker = tmp_path / "ran"
    f = tmp_path / "hosts"
    f.write_text(f"#!/bin/sh\n[all:vars]\nansible_user=ops\nmarker=$(touch {marker})\n[gpu]\ngpu[01:04]\n")
    f.chmod(0o755)
    (tmp_path / "ansible.cfg").write_text("[inventory]\nenable_plugins = script, auto, constructed, ini\n")
    os.chmod(tmp_path, 0o755)  # Ansible ignores an ansible.cfg in a world-writable folder
    proc = _read_in_a_fresh_process(f, {"ANSIBLE_INVENTORY_ENABLED": "script,auto,constructed"}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [f"gpu0{i}@ops" for i in range(1, 5)]
    assert not marker.exists()


def test_a_plugin_shadowing_ansibles_own_ini_is_refused_before_it_is_imported(tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "ini.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    f = tmp_path / "hosts.ini"
    f.write_text("[gpu]\ngpu[01:04] ansible_user=ops\n")
    proc = _read_in_a_fresh_process(f, {"ANSIBLE_INVENTORY_PLUGINS": str(plugins)}, tmp_path)
    assert proc.returncode == 2 and "needs Ansible's own ini inventory plugin" in proc.stdout, proc.stdout + proc.stderr
    assert not marker.exists()

