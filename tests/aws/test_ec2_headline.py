"""The README's headline command end to end, on an EC2 whose instances are real nodes.

``gpuprov up --type p4d.24xlarge --count 4`` against moto behind the shim, where each
instance is a systemd node container booting the launch's user-data with cloud-init
(tests/aws/ec2_nodes.py, a labelled fixture): launch, first contact on the pinned
bootstrap host key, the hand-over to each node's own key, the bootstrap, the health
gate, then exec, provision, patch --check, a spot interruption noticed through IMDSv2,
and down with nothing left.

What differs from a real p4d, and why:
- ``--source mirror`` with the signed fixture repository (NVIDIA's package names, FIXTURE
  payloads): the nodes cannot reach NVIDIA's repository from this machine.
- ``--tags preflight,driver,spot``: the plays that fit four nodes on two cores inside
  the suite's budget. The CUDA, container and microcode plays are proven on real
  packages by the local-node cluster (tests/e2e/test_docker_cluster.py) and each role's
  molecule scenario; the RDMA play needs the EFA installer, which only AWS serves.
- ``--spot``: the same four nodes carry the spot watcher (the spot play runs only on
  spot instances, as IMDS's instance-life-cycle says).
- ``--ssh-cidr 127.0.0.1/32``: the controller reaches the nodes from loopback.
There is no GPU behind these nodes, so the health gate must fail on every node with
"expected 8 NVIDIA GPUs (p4d.24xlarge), found 0" and `up` must exit 1.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.aws import ec2_nodes
from tests.aws.conftest import MOTO_AMI, instances
from tests.aws.moto_shim import Shim
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

NAME = "headline"
COUNT = 4


@pytest.fixture
def repo():
    from gpuprov.providers.docker import bridge_gateway
    from tests.fixtures import patchrepo

    r = patchrepo.start(bridge_gateway())
    yield r
    r.close()


def _image(shim: Shim) -> None:
    """The public image parameter gpuprov reads for its default image, answered with an image
    moto knows (moto holds no public parameters; the node container is what boots)."""
    from gpuprov.providers.aws import preflight

    ssm_name, _, _ = preflight.IMAGE_SOURCES[preflight.DEFAULT_OS]
    shim.ssm_parameters[ssm_name.format(arch="amd64")] = MOTO_AMI


def _spot_marker(ec2: ec2_nodes.Ec2Nodes, iid: str) -> str:
    return ec2.sh(iid, "cat /run/gpuprov/interruption 2>/dev/null").stdout


def test_headline_command_on_emulated_ec2(shim: Shim, ec2: ec2_nodes.Ec2Nodes, repo) -> None:
    _image(shim)
    started = time.monotonic()
    proc = run_cli("up", "--name", NAME, "--type", "p4d.24xlarge", "--count", str(COUNT), "--yes",
                   "--spot", "--ssh-cidr", "127.0.0.1/32", "--source", "mirror", "--mirror-url", repo.url,
                   "--mirror-key-fingerprint", repo.fingerprint, "--tags", "preflight,driver,spot",
                   "--no-rollback", "-o", "json", timeout=1500)
    print(f"up on {COUNT} emulated p4d nodes: {time.monotonic() - started:.0f} s")
    assert proc.returncode == 1, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    assert len(instances(NAME)) == COUNT and len(ec2.instances) == COUNT, proc.stderr[-3000:]
    # First contact was on the pinned bootstrap key; then each node made its own.
    assert proc.stderr.count("host key handed over") == COUNT, proc.stderr[-3000:]
    for iid in ec2.instances:
        # sshd serves only the node's own key, the one gpuprov pinned (its fingerprint).
        keys = ec2.sh(iid, "sshd -T | awk '$1 == \"hostkey\" {print $2}'").stdout.split()
        assert keys == ["/etc/ssh/gpuprov_host_ed25519_key"], keys
        fingerprint = ec2.sh(iid, "ssh-keygen -lf /etc/ssh/gpuprov_host_ed25519_key.pub").stdout.split()[1]
        assert f"own key {fingerprint} pinned" in proc.stderr
        assert ec2.sh(iid, "ls /etc/ssh/ssh_host_ed25519_key 2>&1").returncode != 0
        # cloud-init ran gpuprov's user-data to the end, and found it valid (its schema).
        status = ec2.sh(iid, "cloud-init status --long; cloud-init schema --system")
        assert "status: done" in status.stdout and "Valid cloud-config" in status.stdout, status
    # No GPU behind an emulated p4d: the preflight stops every node before any driver goes
    # on, naming what it expected and found, and `up` fails (exit 1) with the nodes kept.
    assert not result["bootstrap"]["ok"], result["bootstrap"]
    missing = [line for line in proc.stderr.splitlines()
               if "expected 8 NVIDIA GPU(s) on the PCI bus, found 0" in line]
    assert len(missing) == COUNT, proc.stderr[-3000:]
    for iid in ec2.instances:
        assert "nvidia" not in ec2.sh(iid, "dpkg -l 'nvidia*' 2>/dev/null | grep ^ii").stdout

    # exec reaches every node over the handed-over keys.
    proc = run_cli("exec", NAME, "--", "cloud-init", "status")
    assert proc.returncode == 0, proc.stderr
    assert sum(1 for line in proc.stdout.splitlines() if line.endswith("status: done")) == COUNT, proc.stdout

    # The spot play alone (IMDS says these are spot instances), then again: nothing changes.
    proc = run_cli("provision", NAME, "--tags", "spot", "-o", "json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli("provision", NAME, "--tags", "spot", "-o", "json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(h["changed"] == 0 for h in json.loads(proc.stdout)["hosts"].values()), proc.stdout
    # EC2 posts an interruption to one node: its watcher, asking IMDSv2, runs the hook once.
    first, *others = list(ec2.instances)
    notice = ec2.post_spot_interruption(first)
    deadline = time.monotonic() + 60
    while not _spot_marker(ec2, first) and time.monotonic() < deadline:
        time.sleep(1)
    assert json.loads(_spot_marker(ec2, first)) == notice
    assert all(_spot_marker(ec2, iid) == "" for iid in others)
    journal = ec2.sh(first, "journalctl -u gpuprov-spot-watch --no-pager").stdout
    assert journal.count("interruption notice:") == 1, journal

    # GetConsoleOutput shows the boot, as on EC2.
    import boto3

    console = boto3.client("ec2", region_name="us-east-1").get_console_output(InstanceId=first)["Output"]
    assert "Cloud-init v." in console, console[-2000:]

    # down: no instance, no container, no tagged resource left.
    proc = run_cli("down", NAME, "--yes", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert instances(NAME) == [] and ec2.containers() == []
    from gpuprov.providers.aws import api, teardown

    assert teardown.tagged_resources(api.connect("us-east-1"), NAME) == []


def test_a_node_that_never_answers_ssh_is_named_with_its_console_and_nothing_is_left(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault: the second instance of a launch never answers SSH (its port 22 is never
    published). `up` names it with the last lines of its console (GetConsoleOutput) and,
    all or nothing for a new cluster, removes everything it launched."""
    _image(shim)
    ec2.unreachable = {1}
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "45")
    proc = run_cli("up", "--name", "mute", "--type", "g5.xlarge", "--count", "2", "--yes",
                   "--ssh-cidr", "127.0.0.1/32", timeout=600)
    assert proc.returncode != 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "mute-node-2" in line and "not reachable" in line]
    assert lines, proc.stderr[-3000:]
    # (what cloud-init printed last on the console: the bootstrap host key it installed, or on a
    # loaded machine an earlier stage, "Cloud-init v. 22.4.2 running 'modules:config'")
    assert "its console's last lines:" in lines[0] and "cloud-init" in lines[0].lower(), lines[0]
    assert "mute-node-1" not in lines[0].split("not reachable")[0], lines[0]
    assert instances("mute") == [] and ec2.containers() == []
    from gpuprov.providers.aws import api, teardown

    assert teardown.tagged_resources(api.connect("us-east-1"), "mute") == []


def test_a_node_answering_with_an_unpinned_host_key_is_refused_and_nothing_is_left(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault: the second instance's cloud-init never runs the user-data's bootcmd, so the
    bootstrap host key is never installed and cloud-init makes a key of its own. gpuprov
    must refuse to talk to it (the pinned key does not match), name it, and remove what it
    launched; the first instance is handed over as usual before the failure is judged."""
    _image(shim)
    ec2.no_bootcmd = {1}
    monkeypatch.setenv("GPUPROV_AWS_SSH_TIMEOUT", "60")
    proc = run_cli("up", "--name", "spoof", "--type", "g5.xlarge", "--count", "2", "--yes",
                   "--ssh-cidr", "127.0.0.1/32", timeout=600)
    assert proc.returncode != 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "spoof-node-2" in line and "host key" in line.lower()]
    assert lines, proc.stderr[-3000:]
    assert instances("spoof") == [] and ec2.containers() == []


def test_a_baked_ami_is_clean_and_boots_a_new_cluster_of_its_lock(shim: Shim, ec2: ec2_nodes.Ec2Nodes) -> None:
    """Issue 15 on AWS: a node is baked (the provider's bake, called here straight: the gate
    before it, a verify of the whole site, is the same code the local-node bake proves in
    tests/e2e/test_docker_cluster.py, and these GPU-less nodes fail the GPU probes): cleaned
    over its pinned SSH, stopped, captured as an AMI tagged with the lock (image and
    snapshots), terminated. A new cluster of the same lock boots from that AMI without being
    told: cloud-init runs the new launch's user-data (its own bootstrap key, the hand-over to
    the node's own key), and nothing of the first cluster (its login key, host keys, machine
    id) is in the image."""
    import boto3

    from gpuprov.cluster import load, refresh
    from gpuprov.providers import get
    from gpuprov.state import Store

    _image(shim)
    common = ("--type", "g5.xlarge", "--count", "1", "--yes", "--ssh-cidr", "127.0.0.1/32", "--tags", "preflight",
              "--no-rollback", "-o", "json")
    proc = run_cli("up", "--name", "src", *common, timeout=900)
    # (no GPU behind the node: the preflight fails, the node is kept, reachable and handed over)
    assert proc.returncode == 1 and "host key handed over" in proc.stderr, proc.stderr[-3000:]
    (source,) = ec2.instances
    machine_id = ec2.sh(source, "cat /etc/machine-id").stdout.strip()
    store = Store()
    cluster = load(store, "src")
    _, files, nodes = refresh(store, cluster)
    lines: list[str] = []
    image = get("aws").bake(cluster, nodes[0], files, lines.append, copy_to=("us-west-2",))
    refresh(store, load(store, "src"))  # as `image bake --from` does: the node left the cluster
    assert image.lock_hash == cluster.lock["hash"] and image.source == "src/src-node-1", image
    assert any("clean: SSH host keys" in line for line in lines) and any("clean: done" in line for line in lines)
    assert instances("src") == [] and source not in ec2.instances  # the baked node is gone
    ec2_api = boto3.client("ec2", region_name="us-east-1")
    snapshots = ec2_api.describe_snapshots(OwnerIds=["self"], Filters=[
        {"Name": "tag:gpuprov:lock", "Values": [image.lock_hash]}])["Snapshots"]
    assert snapshots, "the AMI's snapshots carry the lock's tag"
    # --copy-to: the copy is tagged the same, and `image list` of that region shows it.
    listed = json.loads(run_cli("image", "list", "--provider", "aws", "--region", "us-west-2", "-o", "json",
                                check=True).stdout)
    assert [(i["lock_hash"], i["region"], i["source"]) for i in listed] == [
        (image.lock_hash, "us-west-2", "src/src-node-1")], listed
    assert any(line.startswith(f"copying to us-west-2: {listed[0]['ref']}") for line in lines), lines
    # Inside the image (the fixture's commit of the node at CreateImage): nothing to log in
    # with, nothing that names the old instance.
    login = (files.dir / "id_ed25519.pub").read_text().split()[1]
    inside = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", ec2.amis[image.id], "-c",
         "ls /etc/ssh | grep -c _key; ls /etc/gpuprov/hostkey-installed /etc/ssh/sshd_config.d/10-gpuprov-hostkey.conf "
         "2>/dev/null | wc -l; cat /etc/machine-id | wc -c; ls /var/lib/cloud/instances 2>/dev/null | wc -l; "
         f"grep -rl -e '{login}' -e 'PRIVATE KEY' /etc /home /root /var/lib/cloud 2>/dev/null | wc -l"],
        capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert inside == ["0", "0", "0", "0", "0"], inside
    assert machine_id and len(machine_id) == 32

    proc = run_cli("up", "--name", "dst", *common, timeout=900)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"image: {image.id} (baked for lock {image.lock_hash} from src/src-node-1" in proc.stderr
    assert json.loads(proc.stdout)["image"]["ref"] == image.id
    assert proc.stderr.count("host key handed over") == 1, proc.stderr[-3000:]
    (fresh,) = ec2.instances
    assert ec2.sh(fresh, "cat /etc/machine-id").stdout.strip() not in ("", machine_id)
    keys = ec2.sh(fresh, "cat /home/gpuprov/.ssh/authorized_keys").stdout.split()
    dst_login = (files.dir.parent / "dst" / "id_ed25519.pub").read_text().split()[1]
    assert login not in keys and dst_login in keys, keys
    assert run_cli("exec", "dst", "--", "true").returncode == 0
    assert run_cli("down", "dst", "--yes", timeout=600).returncode == 0
    gone = run_cli("down", "src", "--yes", timeout=600)
    assert gone.returncode == 0, gone.stderr[-3000:]
    # The image outlives its clusters until deleted; then nothing of it is left.
    proc = run_cli("image", "delete", image.id, "--provider", "aws", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert ec2_api.describe_images(Owners=["self"])["Images"] == [] and image.id not in ec2.amis
    proc = run_cli("image", "delete", listed[0]["ref"], "--provider", "aws", "--region", "us-west-2", "--yes")
    assert proc.returncode == 0, proc.stderr
    _baking_is_allowed_only_with_its_conditions(shim)


def _baking_is_allowed_only_with_its_conditions(shim: Shim) -> None:
    """docs/aws-iam-policy.json allows each call of the bake and the deletes, and none of them
    without the tag that makes it safe: the cluster's on the node, the lock's on what is
    created (tags only within the create call) and on what is deleted."""
    from tests.aws import iam
    from tests.aws.conftest import ROOT_POLICY

    policy = json.loads(ROOT_POLICY.read_text())
    calls = [c for c in iam.mutating(shim.calls)
             if c.action in ("StopInstances", "CreateImage", "CopyImage", "DeregisterImage", "DeleteSnapshot",
                             "CreateTags")]
    assert {c.action for c in calls} == {"StopInstances", "CreateImage", "CopyImage", "DeregisterImage",
                                         "DeleteSnapshot"}, [c.action for c in calls]
    for call in calls:
        for auth in iam.authorizations(call, "src"):
            assert iam.allowed_by(policy, auth), f"refused: {auth} ({call.action})"
            for key in (iam.RESOURCE_TAG, iam.LOCK_RESOURCE_TAG, iam.LOCK_REQUEST_TAG):
                if key in auth.context:
                    bare = iam.Authorization(auth.action, auth.resource,
                                             {k: v for k, v in auth.context.items() if k != key})
                    assert not iam.allowed_by(policy, bare), f"allowed without {key}: {bare}"
