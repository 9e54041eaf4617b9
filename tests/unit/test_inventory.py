"""The rendered inventory is what real Ansible reads, with host key checking on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpuprov.ansible.inventory import render, to_json
from gpuprov.providers import ClusterFiles
from gpuprov.state import NodeRecord


def _nodes() -> list[NodeRecord]:
    return [
        NodeRecord(name=f"c1-node-{i}", id=f"abc{i}", address="127.0.0.1", ssh_port=32000 + i,
                   user="gpuprov", state="running", zone="local", instance_type="docker-node")
        for i in (1, 2)
    ]


def test_inventory_parses_with_ansible_and_pins_host_keys(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path)
    expect = {"c1-node-1": {"gpus": 0}, "c1-node-2": {"gpus": None}}
    context = render("c1", "docker", _nodes(), expect, files)
    text = files.inventory.read_text()
    assert "StrictHostKeyChecking=yes" in text and "StrictHostKeyChecking=no" not in text
    assert f"UserKnownHostsFile={files.known_hosts}" in text
    cfg = files.ansible_cfg.read_text()
    assert "pipelining = True" in cfg and "ControlPersist" in cfg and "host_key_checking = True" in cfg
    assert files.inventory.stat().st_mode & 0o777 == 0o600

    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(files.inventory),
         "--list"],
        capture_output=True, text=True, check=True,
        env={"ANSIBLE_CONFIG": str(files.ansible_cfg), "PATH": "/usr/bin:/bin"},
    )
    parsed = json.loads(out.stdout)
    ours = to_json(context)
    assert sorted(parsed["gpuprov_nodes"]["hosts"]) == ours["gpuprov_nodes"]["hosts"]
    for host, hv in ours["_meta"]["hostvars"].items():
        real = parsed["_meta"]["hostvars"][host]
        for key in ("ansible_host", "ansible_port", "ansible_user", "ansible_ssh_common_args",
                    "ansible_ssh_private_key_file", "gpuprov_expected_gpus"):
            assert str(_plain(real[key])) == str(hv[key]), (host, key, real[key], hv[key])


def _plain(value):
    """ansible-inventory prints an !unsafe string as {"__ansible_unsafe": text}."""
    return value["__ansible_unsafe"] if isinstance(value, dict) and "__ansible_unsafe" in value else value


HOSTILE = [
    "x ansible_ssh_common_args='-o ProxyCommand=touch /tmp/pwned'",
    # (With its newlines this one is refused outright: tests/unit/test_review4_lines.py.)
    "x [gpuprov_nodes:vars] ansible_ssh_common_args=-o StrictHostKeyChecking=no",
    "{{ lookup('pipe', 'touch /tmp/pwned') }}",
    "x: {ansible_host: 10.9.9.9}",
]


def test_no_value_becomes_inventory_syntax_or_a_template(tmp_path: Path) -> None:
    """Finding: host fields were written unescaped into the INI inventory, so a value
    could add host variables (ansible_ssh_common_args over the pinned known_hosts) or
    sections. Every value must come back from real Ansible as exactly the same data,
    and no key, host or group may appear that gpuprov did not write."""
    files = ClusterFiles(tmp_path)
    nodes = [
        NodeRecord(name="n1", id="1", address="127.0.0.1", ssh_port=2222, user="gpuprov",
                   state="running", zone="local", instance_type=value)
        for value in HOSTILE[:1]
    ] + [
        NodeRecord(name=f"n{i}", id=str(i), address="127.0.0.1", ssh_port=2222, user="gpuprov",
                   state="running", zone="local", instance_type=value)
        for i, value in enumerate(HOSTILE[1:], 2)
    ]
    render("c1", "docker", nodes, {}, files)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(files.inventory), "--list"],
        capture_output=True, text=True, check=True,
        env={"ANSIBLE_CONFIG": str(files.ansible_cfg), "PATH": "/usr/bin:/bin"},
    )
    parsed = json.loads(out.stdout)
    assert sorted(parsed["gpuprov_nodes"]["hosts"]) == ["n1", "n2", "n3", "n4"]
    assert set(parsed) == {"_meta", "all", "gpuprov_nodes"}
    for number, value in enumerate(HOSTILE, 1):
        hv = parsed["_meta"]["hostvars"][f"n{number}"]
        assert _plain(hv["gpuprov_instance_type"]) == value
        if "{{" in value:  # tagged unsafe: Ansible will never evaluate it as a template
            assert hv["gpuprov_instance_type"] == {"__ansible_unsafe": value}
        assert "StrictHostKeyChecking=no" not in str(hv["ansible_ssh_common_args"])
        # ansible_local: Ansible's own local facts (none here), which it always lists beside the
        # inventory's variables when facts are not injected as variables (inject_facts_as_vars).
        assert set(hv) - {"ansible_local"} == {"ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                           "gpuprov_instance_type", "gpuprov_expected_gpus", "gpuprov_expected_nvswitch",
                           "gpuprov_expected_efa", "ansible_become",
                           "ansible_python_interpreter", "ansible_ssh_common_args", "gpuprov_cluster",
                           "gpuprov_provider", "gpu_preflight_root_free_gib"}  # (docker: local nodes' need)


def _ansibles_hostvars(files: ClusterFiles) -> dict:
    """Every host's variables as ansible-inventory itself reads the rendered inventory."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(files.inventory), "--list"],
        capture_output=True, text=True, check=True,
        env={"ANSIBLE_CONFIG": str(files.ansible_cfg), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout)["_meta"]["hostvars"]


def test_a_hosts_own_free_space_floor_is_the_one_ansible_uses(tmp_path: Path) -> None:
    """An existing host's root_free_gib (its hosts file) reaches the preflight as a host variable,
    over the group's (a local node's 20); a host that gives none keeps the group's or the role's."""
    files = ClusterFiles(tmp_path)
    nodes = _nodes()
    nodes[0].extra["root_free_gib"] = 7
    context = render("c1", "docker", nodes, {}, files)
    real = _ansibles_hostvars(files)
    ours = to_json(context)["_meta"]["hostvars"]
    assert real["c1-node-1"]["gpu_preflight_root_free_gib"] == ours["c1-node-1"]["gpu_preflight_root_free_gib"] == 7
    assert real["c1-node-2"]["gpu_preflight_root_free_gib"] == ours["c1-node-2"]["gpu_preflight_root_free_gib"] == 20
    (tmp_path / "s").mkdir()
    static = ClusterFiles(tmp_path / "s")
    render("c2", "static", _nodes(), {}, static)
    assert "gpu_preflight_root_free_gib" not in static.inventory.read_text()


def test_a_host_that_keeps_apts_downloads_says_so_to_ansible(tmp_path: Path) -> None:
    """apt_keep_downloads (an existing host's hosts file) reaches the preflight as a boolean host
    variable; a host that gives none has no such variable (the role's default applies)."""
    files = ClusterFiles(tmp_path)
    nodes = _nodes()
    nodes[0].extra["apt_keep_downloads"] = True
    nodes[1].extra["apt_keep_downloads"] = False
    context = render("c1", "static", nodes, {}, files)
    real = _ansibles_hostvars(files)
    ours = to_json(context)["_meta"]["hostvars"]
    for node, keep in (("c1-node-1", True), ("c1-node-2", False)):
        assert real[node]["gpu_preflight_apt_keep_downloads"] is ours[node]["gpu_preflight_apt_keep_downloads"] is keep
    (tmp_path / "s").mkdir()
    plain = ClusterFiles(tmp_path / "s")
    render("c2", "static", _nodes(), {}, plain)
    assert "gpu_preflight_apt_keep_downloads" not in plain.inventory.read_text()
