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
            assert str(real[key]) == str(hv[key]), (host, key, real[key], hv[key])
