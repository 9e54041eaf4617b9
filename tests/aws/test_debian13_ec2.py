"""`up --provider aws --os debian13` end to end, on an EC2 whose instances are real nodes.

Debian 13's image is found through its public SSM parameter (tests/aws/test_debian13_image.py proves
which parameter is read, and the fallback); here the AMI it names boots a real trixie node
(tests/aws/ec2_nodes.py, a labelled fixture: gpuprov/node-ec2:trixie, Debian 13's node image plus
trixie's own cloud-init), so what is proven is what only a trixie instance can show: trixie's
cloud-init runs gpuprov's user-data (the bootstrap host key, the login user) and finds it valid, the
first contact is on the pinned bootstrap key and the hand-over to the node's own key works with
trixie's sshd, and Ansible bootstraps the node under the lock of Debian 13's archive.

The plays: ``--tags microcode,spot`` (``--spot``): microcode installs trixie's own pinned release
(stack data [os.debian13.sources.distro] microcode) and the spot watcher runs under trixie's Python
3.13 and asks the fixture's IMDSv2. The driver and CUDA plays on trixie are
tests/e2e/test_debian13_e2e.py's (`make test-debian13`: a DKMS build and a 2.5 GB toolkit), and these
nodes have no GPU, so the preflight's GPU count would stop them (the preflight's OS rules are run
here as probes, by `verify --only preflight`).
"""

from __future__ import annotations

import json

import pytest

from tests.aws import ec2_nodes
from tests.aws.moto_shim import Shim
from tests.conftest import run_cli
from tests.molecule.scenarios import node_image

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "a trixie instance on the emulated EC2 (Debian 13's node image built first when missing, about two "
    "minutes on a new machine, and its cloud-init image; then about a minute and a half): in `make test` "
    "the same launch, user-data and hand-over on Debian 12 (test_ec2_headline.py), and Debian 13's "
    "image choice by tests/aws/test_debian13_image.py"))]

NAME = "trixie"
TRIXIE = "/aws/service/debian/release/13/latest/amd64"


def test_a_debian13_instance_boots_hands_over_its_key_and_converges(shim: Shim, ec2: ec2_nodes.Ec2Nodes,
                                                                    ami: str) -> None:
    node_image("debian13")  # gpuprov/node:trixie, built when missing or stale
    ec2.boot_as(ami, "trixie")
    shim.ssm_parameters[TRIXIE] = ami
    proc = run_cli("up", "--name", NAME, "--type", "g5.xlarge", "--count", "1", "--yes", "--spot",
                   "--ssh-cidr", "127.0.0.1/32", "--os", "debian13", "--source", "distro",
                   "--tags", "microcode,spot", "--health", "off", "--no-rollback", "-o", "json", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout)["bootstrap"]["ok"] is True
    assert f"from SSM {TRIXIE}" in proc.stderr, proc.stderr[-3000:]
    (iid,) = ec2.instances
    assert "VERSION_CODENAME=trixie" in ec2.sh(iid, "cat /etc/os-release").stdout
    # trixie's cloud-init (25.x, whose schema check words it otherwise than bookworm's 22.4) ran
    # gpuprov's user-data to the end and found it valid.
    status = ec2.sh(iid, "cloud-init status --long; cloud-init schema --system")
    assert "status: done" in status.stdout and "Valid schema user-data" in status.stdout, status
    # First contact on the pinned bootstrap key, then sshd serves only the node's own key, pinned.
    assert proc.stderr.count("host key handed over") == 1, proc.stderr[-3000:]
    keys = ec2.sh(iid, "sshd -T | awk '$1 == \"hostkey\" {print $2}'").stdout.split()
    assert keys == ["/etc/ssh/gpuprov_host_ed25519_key"], keys
    fingerprint = ec2.sh(iid, "ssh-keygen -lf /etc/ssh/gpuprov_host_ed25519_key.pub").stdout.split()[1]
    assert f"own key {fingerprint} pinned" in proc.stderr

    lock = json.loads(run_cli("status", NAME, "-o", "json", check=True).stdout)["stack"]
    pins = {"intel": "3.20260925.1~deb13u1", "amd": "3.20250311.1"}
    assert (lock["os"], lock["source"], lock["microcode"]) == ("debian13", "distro", pins)

    # The probes of those plays pass (microcode at trixie's pin); the preflight's OS rule says trixie.
    proc = run_cli("verify", NAME, "--only", "base or microcode", "-o", "json", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["probe"]: r for r in next(iter(json.loads(proc.stdout)["hosts"].values()))}
    pinned = rows["microcode_package_matches_the_pin"]
    assert pinned["status"] == "pass" and pinned["detail"] in (
        f"intel-microcode {pins['intel']} (the lock's pin)", f"amd64-microcode {pins['amd']} (the lock's pin)"), pinned
    proc = run_cli("verify", NAME, "--only", "preflight", "-o", "json", timeout=600)
    rows = {r["probe"]: r for r in next(iter(json.loads(proc.stdout)["hosts"].values()))}
    assert rows["os_supported"]["status"] == "pass" and rows["os_supported"]["detail"].startswith("debian 13"), rows

    # The spot watcher, under trixie's Python, asks IMDSv2 and runs the hook on a notice.
    notice = ec2.post_spot_interruption(iid)
    marker = ec2.sh(iid, "for i in $(seq 60); do [ -s /run/gpuprov/interruption ] && break; sleep 1; done; "
                         "cat /run/gpuprov/interruption")
    assert json.loads(marker.stdout) == notice, marker
    assert ec2.sh(iid, "python3 -c 'import sys; print(sys.version_info[:2])'").stdout.strip() == "(3, 13)"

    proc = run_cli("down", NAME, "--yes", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ec2.containers() == []
