"""Finding 8: no host private key that a node's sshd keeps using is in EC2 user-data.

User-data carries one bootstrap host key per launch (read back here the way
anyone with ec2:DescribeInstanceAttribute reads it); over the first,
strictly checked connection each node makes its own key and drops the
bootstrap one. The hand-over runs for real against a systemd node container
of the docker provider's image, whose sshd gets the bootstrap key from the
very user-data moto was given.
"""

from __future__ import annotations

import base64
import gzip
import os
import secrets
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpuprov import ssh
from gpuprov.providers import ClusterFiles, ClusterSpec
from gpuprov.state import Store
from tests.aws.conftest import REGION, instances
from tests.aws.helpers import up
from tests.aws.moto_shim import Shim
from tests.conftest import require_docker

# base64 of "openssh-key-v1\0": how every OpenSSH private key body starts, PEM-wrapped or not.
KEY_BODY_MAGIC = "b3BlbnNzaC1rZXktdjE"


def user_data_of(instance_id: str) -> str:
    """What DescribeInstanceAttribute hands anyone allowed to call it."""
    import boto3

    answer = boto3.client("ec2", region_name=REGION).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData")
    raw = base64.b64decode(answer["UserData"]["Value"])
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def public_of(private_pem: str, tmp_path: Path) -> str:
    path = tmp_path / f"key-{secrets.token_hex(4)}"
    path.write_text(private_pem)
    path.chmod(0o600)
    out = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=True).stdout
    path.unlink()
    return " ".join(out.split()[:2])


def private_keys(text: str) -> list[str]:
    from gpuprov.providers.aws.userdata import private_keys_in

    return private_keys_in(text)


def test_user_data_holds_one_bootstrap_key_for_the_whole_launch(capsys, shim: Shim, ami: str,
                                                                 gpuprov_home: Path, tmp_path: Path) -> None:
    code, _, err = up(capsys, ami, "udata", count=3, itype="g5.xlarge")
    assert code == 0, err
    launched = instances("udata")
    assert len(launched) == 3
    texts = {user_data_of(i["InstanceId"]) for i in launched}
    assert len(texts) == 1  # one document for the launch, whatever the count
    (text,) = texts
    # exactly one private key in it, in any form
    assert text.count(KEY_BODY_MAGIC) == 1, text
    (pem,) = private_keys(text)
    assert text.count("PRIVATE KEY-----") == 2  # its BEGIN and END lines, nothing else
    bootstrap = public_of(pem, tmp_path)
    batch = Store().get_cluster("udata").nodes[0].extra["batch"]
    recorded = (gpuprov_home / "clusters" / "udata" / "hostkeys" / f"{batch}-bootstrap.pub").read_text().split()
    assert " ".join(recorded[:2]) == bootstrap
    assert len(text.encode()) < 4096
    doc = yaml.safe_load(text)
    assert doc["ssh_deletekeys"] is False and doc["ssh_genkeytypes"] == ["ed25519"]
    assert "169.254.169.254" not in text  # no per-node key to pick by launch index any more


# -- the hand-over on a real node ----------------------------------------------------------------
def _docker(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], input=input, capture_output=True, text=True, check=False, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


@pytest.fixture
def node_container():
    """One systemd node of the docker provider's image, SSH published on loopback; removed after."""
    require_docker()
    from gpuprov.providers.docker import DEFAULT_IMAGE, SYSTEMD_FLAGS

    name = f"gpuprov-awstest-{secrets.token_hex(4)}"
    image = os.environ.get("GPUPROV_NODE_IMAGE", DEFAULT_IMAGE)
    _docker("run", "-d", "--name", name, "--label", "gpuprov.test=aws-hostkeys", *SYSTEMD_FLAGS,
            "-p", "127.0.0.1::22", image, "/sbin/init")
    try:
        port = int(_docker("port", name, "22/tcp").stdout.split(":")[-1])
        # systemd up (degraded is fine: sshd has no host key yet, as on a fresh image)
        _docker("exec", name, "timeout", "30", "systemctl", "is-system-running", "--wait", check=False)
        yield name, port
    finally:
        _docker("rm", "-f", "-v", name, check=False)


def _offered_keys(port: int) -> set[str]:
    out = subprocess.run(["ssh-keyscan", "-T", "5", "-p", str(port), "127.0.0.1"], capture_output=True,
                         text=True, check=False).stdout
    return {" ".join(line.split()[1:3]) for line in out.splitlines() if line and not line.startswith("#")}


def _pinned(known_hosts: Path, port: int) -> list[str]:
    name = ssh.known_hosts_name("127.0.0.1", port)
    return [" ".join(line.split()[1:3]) for line in known_hosts.read_text().splitlines()
            if line.split(" ", 1)[0] == name]


def test_hand_over_replaces_the_bootstrap_key_on_a_real_node(capsys, shim: Shim, ami: str, gpuprov_home: Path,
                                                             tmp_path: Path, node_container, monkeypatch) -> None:
    from gpuprov.providers.aws import PROVIDER
    from gpuprov.providers.aws.options import AwsOptions

    started = time.monotonic()
    container, port = node_container
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "45")
    code, _, err = up(capsys, ami, "handover", count=1, itype="g5.xlarge")
    assert code == 0, err
    (node,) = Store().get_cluster("handover").nodes
    text = user_data_of(node.id)
    (pem,) = private_keys(text)
    bootstrap = public_of(pem, tmp_path)
    doc = yaml.safe_load(text)

    # What cloud-init does on the instance: the user-data's bootcmd installs the bootstrap
    # key (run here as it is, in the node), the admin user gets the cluster's login key.
    _docker("exec", "-i", container, "/bin/sh", "-s", input=doc["bootcmd"][0][2])
    login = doc["users"][1]["ssh_authorized_keys"][0]
    _docker("exec", "-i", container, "/bin/sh", "-c",
            "install -d -m 0700 -o gpuprov -g gpuprov /home/gpuprov/.ssh && "
            "cat > /home/gpuprov/.ssh/authorized_keys && chown gpuprov: /home/gpuprov/.ssh/authorized_keys && "
            "chmod 0600 /home/gpuprov/.ssh/authorized_keys && systemctl reset-failed ssh.service; systemctl restart ssh.service", input=login + "\n")
    assert _offered_keys(port) == {bootstrap}

    # The instance as gpuprov knows it, reached at the container's published port.
    files = ClusterFiles(gpuprov_home / "clusters" / "handover")
    here = replace(node, address="127.0.0.1", ssh_port=port)
    spec = ClusterSpec(name="handover", provider="aws", instance_type="g5.xlarge", count=1, options=AwsOptions())
    said: list[str] = []
    PROVIDER.wait_ready(spec, [here], files, said.append)

    (pinned,) = _pinned(files.known_hosts, port)
    assert pinned != bootstrap  # the key gpuprov finally pins is not the one in user-data
    assert "host key handed over" in said[-1], said
    offered = _offered_keys(port)
    assert bootstrap not in offered and offered == {pinned}  # sshd no longer offers the bootstrap key
    on_node = _docker("exec", container, "sh", "-c", "cat /etc/ssh/*.pub").stdout
    assert bootstrap.split()[1] not in on_node
    # a strictly checked connection with the new key works
    strict = subprocess.run(
        ["ssh", "-p", str(port), *ssh.ssh_options(files.known_hosts, files.key), "-o", "BatchMode=yes",
         "--", f"{here.user}@127.0.0.1", "sudo -n cat /etc/ssh/gpuprov_host_ed25519_key.pub"],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=60)
    assert strict.returncode == 0, strict.stderr
    assert " ".join(strict.stdout.split()[:2]) == pinned

    # A second run changes nothing: same key pinned, same key on the node.
    said.clear()
    PROVIDER.wait_ready(spec, [here], files, said.append)
    assert _pinned(files.known_hosts, port) == [pinned]
    assert _offered_keys(port) == {pinned}
    assert "its own host key" in said[-1], said
    assert _docker("exec", container, "sh", "-c", "cat /etc/ssh/*.pub").stdout == on_node

    # A run that stopped after the node switched keys but before gpuprov confirmed the new one
    # (only the pending record was written) is finished with the key the node printed.
    from gpuprov.providers.aws import hostkeys

    record = hostkeys.own_key_file(files, here)
    record.replace(hostkeys.pending_file(record))
    said.clear()
    PROVIDER.wait_ready(spec, [here], files, said.append)
    assert record.exists() and not hostkeys.pending_file(record).exists()
    assert _pinned(files.known_hosts, port) == [pinned] and _offered_keys(port) == {pinned}

    # Whoever read the bootstrap key from user-data cannot pose as the node afterwards:
    # gpuprov never falls back to it once the node's own key is confirmed.
    _docker("exec", "-i", container, "/bin/sh", "-c",
            "rm -f /etc/gpuprov/hostkey-installed && /bin/sh -s && systemctl reset-failed ssh.service; systemctl restart ssh.service",
            input=doc["bootcmd"][0][2].replace('[ -e /etc/gpuprov/hostkey-installed ] && exit 0', ':')
            + "rm -f /etc/ssh/gpuprov_host_ed25519_key*\n")
    assert _offered_keys(port) == {bootstrap}
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "10")
    from gpuprov.errors import GpuprovError

    with pytest.raises(GpuprovError, match="does not match the pinned key"):
        PROVIDER.wait_ready(spec, [here], files, said.append)
    assert _pinned(files.known_hosts, port) == [pinned]
    assert time.monotonic() - started < 60
