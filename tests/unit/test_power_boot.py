"""A dynamic node's way into Slurm on AWS, its parts (gpuprov.providers.aws.power_boot): the
user-data a resume gives one node (cloud-config as JSON: its Slurm name, the power service's
login key, a host key of its own and nothing else secret), every value checked before it is
written, and the hand-over the node unpacks (the munge key, 0400, and slurmd configured by
slurmctld). The node's side runs for real in tests/aws/test_power_aws.py."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.providers.aws import power_boot


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[power_boot.Bootstrap, str]:
    work = tmp_path_factory.mktemp("keys")
    login = ssh.ensure_keypair(work / "login_ed25519", "gpuprov-power").with_suffix(".pub").read_text()
    return power_boot.Bootstrap.new(work, "train-dy-3"), login


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def test_the_user_data_names_the_node_its_keys_and_no_other_secret(keys) -> None:
    bootstrap, login = keys
    text = power_boot.user_data("train-dy-3", login, bootstrap, "train-dy-3-1796663196").decode()
    assert text.startswith("#cloud-config\n")
    document = json.loads(text.split("\n", 1)[1])
    assert yaml.safe_load(text) == document  # what cloud-init reads: YAML, of which JSON is a part
    assert document["hostname"] == "train-dy-3" and document["preserve_hostname"] is False
    (user,) = [u for u in document["users"] if isinstance(u, dict)]
    assert user["name"] == "gpuprov-power" and user["lock_passwd"] is True
    assert user["ssh_authorized_keys"] == [" ".join(login.split()[:2])]
    (bootcmd,) = document["bootcmd"]
    assert bootcmd[:2] == ["/bin/sh", "-c"] and bootcmd[3:] == ["bootcmd", bootstrap.private, bootstrap.public,
                                                                  "train-dy-3-1796663196"]
    # The values are the script's arguments, never its text: the one private key is the bootstrap's.
    assert "PRIVATE KEY" not in bootcmd[2] and "$1" in bootcmd[2]
    assert [s for s in _strings(document) if "PRIVATE KEY" in s] == [bootstrap.private]
    assert len(text.encode()) < 16 * 1024  # EC2's user-data limit


@pytest.mark.parametrize("change", [
    {"node": "train-dy-3\nhostname: evil"}, {"node": "train-node-1"}, {"node": "Train-dy-1"},
    {"login": "ssh-ed25519 AAAA\nssh-rsa BBBB"}, {"login": "ssh-rsa " + "A" * 68},
    {"private": "-----BEGIN OPENSSH PRIVATE KEY-----\n$(reboot)\n-----END OPENSSH PRIVATE KEY-----\n"},
    {"public": "ssh-ed25519 " + "A" * 67 + "'"}, {"resume": "r1; reboot"},
])
def test_a_value_that_is_not_what_it_must_be_is_refused(keys, change) -> None:
    bootstrap, login = keys
    boot = power_boot.Bootstrap(change.get("private", bootstrap.private), change.get("public", bootstrap.public))
    with pytest.raises(GpuprovError):
        power_boot.user_data(change.get("node", "train-dy-3"), change.get("login", login), boot,
                             change.get("resume", "r1"))


def test_the_handover_is_the_munge_key_and_slurmds_configuration_from_the_controller() -> None:
    archive = power_boot.handover("10.0.3.7", b"m" * 1024)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        read = {name: tar.extractfile(m).read() for name, m in members.items()}  # type: ignore[union-attr]
    key = members["etc/munge/munge.key"]
    assert (key.mode, key.uid, key.gid, read["etc/munge/munge.key"]) == (0o400, 0, 0, b"m" * 1024)
    defaults = [n for n in read if n.endswith("default/slurmd")]
    assert defaults and read[defaults[0]] == b"SLURMD_OPTIONS=--conf-server 10.0.3.7\n"  # no -b: EC2 boots
    assert all(m.isfile() and not m.name.startswith("/") and ".." not in m.name for m in members.values())
    with pytest.raises(GpuprovError, match="expected an IP address"):
        power_boot.handover("ctl.example\nEvil", b"m")


def test_join_refuses_an_address_that_is_not_one(tmp_path: Path, keys) -> None:
    bootstrap, _ = keys
    with pytest.raises(ValueError):
        power_boot.join("10.0.0.1 -oProxyCommand=x", "train-dy-3", bootstrap, tmp_path / "k", tmp_path, b"")
