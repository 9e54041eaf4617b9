from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.errors import BadInput
from gpuprov.providers.static import parse_hosts_file


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not used by the parser\n")
    return path


def test_gpuprov_yaml(tmp_path: Path, key: Path) -> None:
    f = tmp_path / "hosts.yml"
    f.write_text(f"""
user: ubuntu
key: {key}
hosts:
  - name: gpu01
    address: 10.1.0.11
    instance_type: p4d.24xlarge
  - name: gpu02
    address: 10.1.0.12
    port: 2222
    gpus: 4
    user: admin
""")
    hosts, known = parse_hosts_file(str(f))
    assert known is None
    assert [(h.name, h.address, h.user, h.port) for h in hosts] == [
        ("gpu01", "10.1.0.11", "ubuntu", 22), ("gpu02", "10.1.0.12", "admin", 2222)]
    assert hosts[0].instance_type == "p4d.24xlarge" and hosts[1].gpus == 4
    assert hosts[0].key == str(key)
    assert hosts[0].root_free_gib is None


def test_a_host_sets_its_own_free_space_floor(tmp_path: Path, key: Path) -> None:
    """An on-prem host with a small root file system (/var on another disk) says so: gpuprov's
    name in its YAML, the role's own variable in an Ansible inventory, group vars included."""
    f = tmp_path / "hosts.yml"
    f.write_text(f"user: u\nkey: {key}\nroot_free_gib: 25\nhosts:\n  - name: a\n    address: 10.1.0.1\n"
                 "  - name: b\n    address: 10.1.0.2\n    root_free_gib: 0\n")
    assert [h.root_free_gib for h in parse_hosts_file(str(f))[0]] == [25, 0]
    f = tmp_path / "hosts.ini"
    f.write_text("[gpu]\nnode1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2 gpu_preflight_root_free_gib=12\n"
                 "[gpu:vars]\nansible_user=x\ngpu_preflight_root_free_gib=30\n")
    assert [(h.name, h.root_free_gib) for h in parse_hosts_file(str(f))[0]] == [("node1", 30), ("node2", 12)]


def test_a_host_keeps_apts_downloads_when_it_says_so(tmp_path: Path, key: Path) -> None:
    """apt_keep_downloads (gpuprov's YAML) or gpu_preflight_apt_keep_downloads (an inventory):
    YAML's booleans, or the words an INI file gives as text; unset: the role's default."""
    f = tmp_path / "hosts.yml"
    f.write_text(f"user: u\nkey: {key}\nhosts:\n  - name: a\n    address: 10.1.0.1\n    apt_keep_downloads: true\n"
                 "  - name: b\n    address: 10.1.0.2\n    apt_keep_downloads: false\n"
                 "  - name: c\n    address: 10.1.0.3\n")
    assert [h.apt_keep_downloads for h in parse_hosts_file(str(f))[0]] == [True, False, None]
    f = tmp_path / "hosts.ini"
    f.write_text("[gpu]\nnode1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2 gpu_preflight_apt_keep_downloads=no\n"
                 "[gpu:vars]\nansible_user=x\ngpu_preflight_apt_keep_downloads=true\n")
    assert [(h.name, h.apt_keep_downloads) for h in parse_hosts_file(str(f))[0]] == [("node1", True), ("node2", False)]


def test_ansible_yaml_inventory(tmp_path: Path, key: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text(f"""
all:
  vars:
    ansible_user: ubuntu
  children:
    gpu:
      vars:
        ansible_ssh_private_key_file: {key}
      hosts:
        a100-1: {{ansible_host: 192.0.2.1}}
        a100-2: {{ansible_host: 192.0.2.2, ansible_port: 2200}}
""")
    hosts, _ = parse_hosts_file(str(f))
    assert [(h.name, h.address, h.port, h.user) for h in hosts] == [
        ("a100-1", "192.0.2.1", 22, "ubuntu"), ("a100-2", "192.0.2.2", 2200, "ubuntu")]


def test_ini_inventory(tmp_path: Path, key: Path) -> None:
    f = tmp_path / "hosts.ini"
    f.write_text(f"""
# on-prem rack 3
[gpu]
node1 ansible_host=192.0.2.10 ansible_port=22
node2 ansible_host=192.0.2.11 gpuprov_gpus=8

[gpu:vars]
ansible_user=root
ansible_ssh_private_key_file={key}
""")
    hosts, _ = parse_hosts_file(str(f))
    assert [(h.name, h.address, h.user, h.gpus) for h in hosts] == [
        ("node1", "192.0.2.10", "root", None), ("node2", "192.0.2.11", "root", 8)]


@pytest.mark.parametrize(
    ("text", "suffix", "message"),
    [
        ("hosts: [1, 2", ".yml", "malformed"),
        ("- just\n- a list\n", ".yml", "expected a mapping"),
        ("hosts:\n  - address: 1.2.3.4\n", ".yml", "has no name"),
        ("hosts:\n  - name: a\n    user: u\n  - name: a\n    user: u\n", ".yml", "more than once"),
        ("hosts:\n  - name: a\n", ".yml", "no user"),
        ("hosts:\n  - name: a\n    user: u\n    port: 70000\n", ".yml", "not a number from 1 to 65535"),
        ("hosts:\n  - name: a\n    user: u\n    key: /nonexistent/key\n", ".yml", "not found"),
        # INI is read by Ansible's ini plugin: its reason, with the line it stopped at.
        ("[gpu\nnode1 ansible_user=x\n", ".ini", r"malformed \(ini inventory\): .* \(line 1\)"),
        ("node1 ansible_user\n", ".ini", r"Expected key=value .* \(line 1\)"),
        ("hosts: []\n", ".yml", "lists no hosts"),
        # Findings of the trust review: each value reaches ssh and Ansible as data of one shape.
        ('hosts:\n  - name: a\n    user: "-oProxyCommand=touch /tmp/x"\n', ".yml",
         "host a: user: invalid user"),
        ('hosts:\n  - name: a\n    user: u\n    address: "-oProxyCommand=x"\n', ".yml",
         "host a: address: invalid address"),
        ('hosts:\n  - name: a\n    user: u\n    address: "10.0.0.1 ansible_ssh_common_args=x"\n', ".yml",
         "invalid address"),
        ("hosts:\n  - name: a\n    user: u\n    key: 123\n", ".yml", "host a: key: expected a one-line string"),
        ("hosts:\n  - name: a\n    user: u\n    port: true\n", ".yml", "host a: port: port must be a whole"),
        ("hosts:\n  - name: a\n    user: u\n    gpus: -5\n", ".yml", "host a: gpus: expected a whole number"),
        ("hosts:\n  - name: a\n    user: u\n    root_free_gib: 2.5\n", ".yml",
         "host a: root_free_gib: expected a whole number"),
        ("[gpu]\nnode1 ansible_user=x gpu_preflight_root_free_gib=lots\n", ".ini",
         "host node1: gpu_preflight_root_free_gib: expected a whole number"),
        ("hosts:\n  - name: a\n    user: u\n    apt_keep_downloads: 1\n", ".yml",
         "host a: apt_keep_downloads: expected true or false"),
        ("[gpu]\nnode1 ansible_user=x gpu_preflight_apt_keep_downloads={{lookup('pipe','id')}}\n", ".ini",
         "host node1: gpu_preflight_apt_keep_downloads: expected true or false"),
        ("hosts:\n  - name: a\n    user: [u, v]\n", ".yml", "host a: user: invalid user"),
        ("hosts:\n  - name: a\n    user: u\n    instance_type: \"{{ lookup('pipe','id') }}\"\n", ".yml",
         "invalid instance type"),
        ('hosts:\n  - name: "a b"\n    user: u\n', ".yml", "invalid host name"),
        ("hosts:\n  - name: a\n    user: u\n    host_key: \"ssh-ed25519 AAAA\\nx\"\n", ".yml",
         "host_key"),
        ("[gpu]\nnode1 ansible_user=x\nnode1 ansible_host=10.0.0.9\n", ".ini", "listed more than once"),
        ("[gpu]\nnode1 ansible_user=x ansible_host=10.0.0.9\nnode2 ansible_user=x ansible_host=10.0.0.9\n",
         ".ini", "10.0.0.9:22 is listed for more than one host"),
    ],
)
def test_bad_hosts_files_are_bad_input(tmp_path: Path, text: str, suffix: str, message: str) -> None:
    f = tmp_path / f"hosts{suffix}"
    f.write_text(text)
    with pytest.raises(BadInput, match=message):
        parse_hosts_file(str(f))


def test_missing_hosts_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not found"):
        parse_hosts_file(str(tmp_path / "nope.yml"))


@pytest.mark.parametrize("data", ["hosts:\n  - name: a\n".encode("utf-16"), b"\x00\x01\x02binary",
                                  b"hosts:\n  - name: \xff\n"])
def test_binary_or_utf16_hosts_file_is_bad_input(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "hosts.yml"
    f.write_bytes(data)
    with pytest.raises(BadInput, match=r"is not (a text file|UTF-8 text)"):
        parse_hosts_file(str(f))


def test_a_host_without_a_key_logs_in_with_the_users_keys_and_old_records_learn_it(
    tmp_path: Path, key: Path
) -> None:
    """Which hosts take the user's agent and default keys is the static provider's record
    (``login``), not a provider name other modules test for (gpuprov/ssh.py ``node_key``)."""
    from dataclasses import replace

    from gpuprov import ssh
    from gpuprov.providers import ClusterFiles, ClusterSpec, Plan
    from gpuprov.providers.static import PROVIDER
    from gpuprov.providers.static.options import StaticOptions

    f = tmp_path / "hosts.yml"
    f.write_text(f"user: ops\nhosts:\n  - name: own\n    address: 10.1.0.11\n    key: {key}\n"
                 "  - name: agent\n    address: 10.1.0.12\n")
    spec = ClusterSpec(name="rack", provider="static", instance_type=None, count=None,
                       options=StaticOptions(hosts_file=str(f)))
    files = ClusterFiles(tmp_path / "rack")
    own, agent = PROVIDER.launch(Plan(spec=spec, existing=0, billable=False), files, lambda _: None)
    assert ssh.node_key(own, files.key) == key.resolve()
    assert agent.extra["login"] == ssh.USER_KEYS and ssh.node_key(agent, files.key) is None
    # A record of a host without a key written before ``login`` existed: describe adds it.
    old = replace(agent, extra={k: v for k, v in agent.extra.items() if k != "login"})
    assert ssh.node_key(old, files.key) == files.key
    assert PROVIDER.describe("rack", [own, old], files) == [own, agent]
