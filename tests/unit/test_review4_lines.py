"""Review 4, item 1: a node's words stay data. An IPv6 zone id carries nothing but an
interface's characters past address validation (gpuprov.validate.address and the slurm role's
own check), and every writer of a line-based file refuses a value with a newline or another
control character, whatever validated it before: known_hosts (gpuprov.ssh.pin_host_keys), the
inventory (gpuprov.ansible.inventory.render), slurm.conf, gres.conf and the task environment
(the slurm role's filter plugin)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import ssh, validate
from gpuprov.ansible.inventory import render
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.slurm import conf
from gpuprov.state import NodeRecord

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
CONTROLS = ["\n", "\r", "\x00", "\t", "\x0b", "\x1b", "\x7f", "\x85", "\u2028"]


@pytest.mark.parametrize("value", [
    "fe80::1%eth0\n* ssh-ed25519 AAAA",  # the review's known_hosts line for every host
    "fe80::1%x\nSlurmdUser=root",  # the review's slurm.conf line
    "fe80::1%a b", "fe80::1%#x", "fe80::1%a=b", "fe80::1%*", "fe80::1%é",
])
def test_a_zone_id_outside_an_interfaces_characters_is_refused(value: str) -> None:
    with pytest.raises(BadInput, match="zone id"):
        validate.address(value, "hosts.yml: gpu01")


def test_a_plain_zone_id_is_still_an_address() -> None:
    assert validate.address("fe80::1%eth0", "x") == "fe80::1%eth0"
    assert validate.address("fe80::1%enp0s31f6.100", "x") == "fe80::1%enp0s31f6.100"
    assert validate.address("fe80::1%3", "x") == "fe80::1%3"


@pytest.mark.parametrize("control", CONTROLS)
def test_one_line_refuses_every_control_character_in_strings_lists_and_keys(control: str) -> None:
    for value in (f"a{control}b", [f"a{control}"], {"k": f"{control}"}, {f"k{control}": "v"}, ("x", [f"{control}"])):
        with pytest.raises(BadInput, match="control character"):
            validate.one_line(value, "where")
    assert validate.one_line({"k": ["a b", 3, None, True]}, "where") == {"k": ["a b", 3, None, True]}


@pytest.mark.parametrize("control", CONTROLS)
def test_known_hosts_refuses_a_line_breaking_address_whatever_checked_it(tmp_path: Path, control: str) -> None:
    known = tmp_path / "known_hosts"
    ssh.pin_host_keys(known, {("10.0.0.1", 22): KEY})
    before = known.read_text()
    with pytest.raises(BadInput):
        ssh.pin_host_keys(known, {(f"fe80::1%eth0{control}* {KEY}", 22): KEY})
    assert known.read_text() == before  # nothing written


@pytest.mark.parametrize("host", ["*", "10.0.0.*", "a,b", "a b", "!10.0.0.1", "10.0.0.?"])
def test_known_hosts_refuses_a_host_field_that_names_other_hosts(tmp_path: Path, host: str) -> None:
    with pytest.raises(BadInput, match="pattern"):
        ssh.pin_host_keys(tmp_path / "known_hosts", {(host, 22): KEY})


def test_known_hosts_refuses_a_control_character_in_the_key(tmp_path: Path) -> None:
    with pytest.raises(BadInput):
        ssh.pin_host_keys(tmp_path / "known_hosts", {("10.0.0.1", 22): "ssh-ed25519 AAAA\x1b]52;c;x\x07"})


@pytest.mark.parametrize("control", CONTROLS)
def test_the_inventory_refuses_a_value_with_a_control_character(tmp_path: Path, control: str) -> None:
    files = ClusterFiles(tmp_path)
    node = NodeRecord(name="n1", id="1", address="127.0.0.1", ssh_port=2222, user="gpuprov",
                      state="running", zone="local",
                      instance_type=f"x{control}[gpuprov_nodes:vars]{control}ansible_ssh_common_args=-o StrictHostKeyChecking=no")
    with pytest.raises(BadInput, match="inventory"):
        render("c1", "docker", [node], {}, files)
    assert not files.inventory.exists()


def _facts(address: str) -> dict:
    return {"hostname": "n1", "processor_vcpus": 4, "processor_count": 1, "processor_cores": 4,
            "processor_threads_per_core": 1, "memtotal_mb": 16384, "default_ipv4": {"address": address}}


def _description(node: dict, **over) -> dict:
    return {"cluster_name": "train", "controller": "n1", "nodes": [node], **over}


@pytest.mark.parametrize("address", ["fe80::1%x\nSlurmdUser=root", "fe80::1%x SlurmdUser=root",
                                     "fe80::1%x#", "fe80::1%x=y", "fe80::1%x\r"])
def test_a_nodes_fact_address_cannot_add_a_slurm_conf_line(address: str) -> None:
    rules = conf.rules()
    node = rules.node_from_facts(_facts(address))
    with pytest.raises(rules.SlurmConfError, match="zone id"):
        rules.slurm_conf(_description(node))
    with pytest.raises(rules.SlurmConfError, match="zone id"):
        rules.slurm_conf(_description(rules.node_from_facts(_facts("10.0.0.1")), controller_addr=address))
    with pytest.raises(rules.SlurmConfError, match="zone id"):
        rules.gres_conf(_description({**node, "gpus": 1}))


def test_a_plain_zone_id_still_makes_a_slurm_conf() -> None:
    rules = conf.rules()
    text = rules.slurm_conf(_description(rules.node_from_facts(_facts("fe80::1%eth0"))))
    assert " NodeAddr=fe80::1%eth0 " in text


def test_the_slurm_writers_check_every_line_they_write() -> None:
    rules = conf.rules()
    assert rules._lines("a=b\nc=d\n", "f") == "a=b\nc=d\n"
    for control in CONTROLS[1:]:
        with pytest.raises(rules.SlurmConfError, match="control character"):
            rules._lines(f"a=b\nc={control}d\n", "slurm.conf")
