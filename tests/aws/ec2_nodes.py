"""Test fixture: an EC2 whose instances are real nodes.

A test double, never product code. It sits in the moto shim (``moto_shim.Shim.nodes``):
each instance a RunInstances call starts becomes one systemd node container of an
image built here from the local node image plus Debian's ``cloud-init``
(``gpuprov/node-ec2:bookworm``; ``gpuprov/node-ec2:trixie`` from Debian 13's node image for the
AMIs a test boots as trixie, ``Ec2Nodes.boot_as``), so that:

- the launch's user-data (what gpuprov wrote: the bootstrap host key, the login user)
  is really executed at boot by cloud-init, fed through the NoCloud datasource (a seed
  directory mounted at ``/var/lib/cloud/seed/nocloud``);
- the instance answers SSH on port 22 of its own loopback address (127.X.Y.N), and
  DescribeInstances reports that address as its public one (an elastic IP gpuprov
  attaches included), so gpuprov connects exactly as on EC2;
- IMDSv2 answers at 169.254.169.254 inside the node (``ec2_node/imds.py``), with the
  instance's id, type, zone, life cycle and, once a test posts one, a spot
  interruption notice;
- TerminateInstances removes the container; GetConsoleOutput returns the node's
  cloud-init console log;
- CreateImage commits the instance's container as the AMI's image (``gpuprov-fixture-ami:AMI``;
  moto keeps the AMI's record), RunInstances of that AMI boots it, DeregisterImage removes it.
  The container is committed as it runs (EC2 would capture the stopped instance's volume;
  gpuprov syncs the file system before it asks), without its volumes and mounts.

Injected faults: ``unreachable`` (launch indexes whose port 22 is never published: a
node that never answers SSH), ``no_bootcmd`` (launch indexes whose cloud-init never runs
the user-data's bootcmd: a node that answers with a host key gpuprov did not pin),
``broken_bootstrap`` (FIXTURE fault: the Nth instance this fixture boots, counted from 0
across every launch of the test, so replacements too, gets a read-only
``/etc/ansible/facts.d``, as a disk remounted read-only would leave it: it boots, runs
cloud-init and answers SSH, and the first play's write there fails, so its bootstrap fails),
besides the shim's own API faults.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import io
import itertools
import json
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent / "ec2_node"
BASE_IMAGE = "gpuprov/node:{codename}"
IMAGE = "gpuprov/node-ec2:{codename}"
LABEL = "gpuprov.fixture-ec2"

# Where each fixture file goes in the image.
IMAGE_FILES = {
    "imds.py": ("usr/local/lib/gpuprov-fixture/imds.py", 0o755),
    "gpuprov-fixture-imds.service": ("etc/systemd/system/gpuprov-fixture-imds.service", 0o644),
    "90-gpuprov-fixture.cfg": ("etc/cloud/cloud.cfg.d/90-gpuprov-fixture.cfg", 0o644),
    "ssh-after-cloud-init.conf": ("etc/systemd/system/ssh.service.d/10-after-cloud-init.conf", 0o644),
}

# What a cloud image is, from the local node image: cloud-init from Debian's archive, and
# no login user of its own (cloud-init makes the one the user-data names).
_INSTALL = """set -eu
printf 'Acquire::http::Proxy "%s";\\n' "$1" > /etc/apt/apt.conf.d/00gpuprov-fixture-proxy
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cloud-init locales >/dev/null
# The locale cloud-init's default configuration sets, generated as in a cloud image.
sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
locale-gen >/dev/null
rm -f /etc/apt/apt.conf.d/00gpuprov-fixture-proxy /etc/sudoers.d/gpuprov
# A cloud image names no host key in sshd's configuration (the local image names the one
# gpuprov injects before boot); the user-data's bootcmd names the bootstrap key.
sed -i '/^HostKey /d' /etc/ssh/sshd_config.d/10-gpuprov.conf
userdel -r gpuprov 2>/dev/null || true
rm -rf /var/lib/cloud/* /var/lib/apt/lists/*
apt-get clean
touch -d @0 /var/lib/apt/lists
"""


def _docker(*args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(["docker", *args], capture_output=True, input=input, check=False, timeout=900)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])}: {proc.stderr.decode()[-2000:]}")
    return proc


def _recipe(base_image: str) -> str:
    base = _docker("image", "inspect", "-f", "{{.Id}}", base_image).stdout.decode().strip()
    digest = hashlib.sha256(base.encode() + _INSTALL.encode())
    for name in sorted(IMAGE_FILES):
        digest.update(name.encode() + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def _tar(entries: list[tuple[str, bytes | str, int]]) -> bytes:
    """(path, bytes, mode) files, or (path, link target, -1) symlinks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data, mode in entries:
            info = tarfile.TarInfo(path)
            if mode < 0:
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
                tar.addfile(info)
                continue
            payload = data if isinstance(data, bytes) else data.encode()
            info.size, info.mode = len(payload), mode
            tar.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


def build_image(apt_proxy: str, codename: str = "bookworm") -> str:
    """The emulated-EC2 node image of Debian ``codename`` (its local node image, gpuprov/node:CODENAME,
    must exist), built once per recipe (base image and fixture files)."""
    base_image, image = BASE_IMAGE.format(codename=codename), IMAGE.format(codename=codename)
    recipe = _recipe(base_image)
    have = _docker("image", "inspect", "-f", "{{index .Config.Labels \"gpuprov.fixture-recipe\"}}", image,
                   check=False)
    if have.returncode == 0 and have.stdout.decode().strip() == recipe:
        return image
    work = f"gpuprov-ec2-image-{uuid.uuid4().hex[:8]}"
    _docker("create", "--name", work, base_image, "sh", "-c", _INSTALL, "install", apt_proxy)
    try:
        _docker("start", "-a", work)
        files = [(dest, (HERE / name).read_bytes(), mode) for name, (dest, mode) in IMAGE_FILES.items()]
        files.append(("etc/systemd/system/multi-user.target.wants/gpuprov-fixture-imds.service",
                      "/etc/systemd/system/gpuprov-fixture-imds.service", -1))
        _docker("cp", "-", f"{work}:/", input=_tar(files))
        _docker("commit", "--change", 'CMD ["/sbin/init"]', "--change",
                f"LABEL gpuprov.fixture-recipe={recipe}", work, image)
    finally:
        _docker("rm", "-f", work, check=False)
    return image


@dataclass
class Instance:
    id: str
    address: str
    container: str
    workdir: Path


@dataclass
class Ec2Nodes:
    """The instances of one test session, by instance id."""

    apt_proxy: str
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    instances: dict[str, Instance] = field(default_factory=dict)
    unreachable: set[int] = field(default_factory=set)  # launch indexes never published on port 22
    # Launch indexes whose cloud-init never runs the user-data's bootcmd (cut from their
    # seed): the node comes up with a host key cloud-init made, not the pinned bootstrap key.
    no_bootcmd: set[int] = field(default_factory=set)
    # FIXTURE fault: boot numbers (0, 1, ... in the order instances boot, across launches) whose
    # /etc/ansible/facts.d is a read-only mount: their bootstrap fails, nothing before it does.
    broken_bootstrap: set[int] = field(default_factory=set)
    _booted: itertools.count = field(default_factory=itertools.count)
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpuprov-ec2-")))
    _addresses: itertools.count = field(default_factory=lambda: itertools.count(10))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    image: str = ""
    # True: DescribeInstances gives each emulated instance's loopback address as its private one
    # too (where a controller inside the VPC reaches it: the AWS power service's joins).
    private_on_loopback: bool = False
    # AMI id -> the Docker image CreateImage committed for it.
    amis: dict[str, str] = field(default_factory=dict)
    # AMI id -> the node image of another OS it boots (``boot_as``); kept on close (built once per recipe).
    os_images: dict[str, str] = field(default_factory=dict)
    # A /24 of 127.0.0.0/8 of this session's own (chosen at random): two sessions on one
    # machine never publish port 22 on the same address.
    _net: str = field(default_factory=lambda: f"127.{secrets.randbelow(254) + 1}.{secrets.randbelow(254) + 1}")

    def __post_init__(self) -> None:
        self.image = build_image(self.apt_proxy)

    # -- what the shim calls ---------------------------------------------------------------
    def launched(self, params: dict[str, str], response: bytes) -> None:
        """A RunInstances answer: one node container per instance, booting its user-data."""
        user_data = base64.b64decode(params.get("UserData", "") or b"")
        spot = params.get("InstanceMarketOptions.MarketType") == "spot"
        for item in _items(response):
            iid = item["instanceId"]
            with self._lock:
                address = f"{self._net}.{next(self._addresses)}"
                number = next(self._booted)
            index = int(item.get("amiLaunchIndex") or 0)
            work = self.workdir / iid
            (work / "seed").mkdir(parents=True)
            (work / "imds").mkdir()
            hostname = "ip-" + (item.get("privateIpAddress") or "10.0.0.1").replace(".", "-")
            (work / "seed" / "meta-data").write_text(f"instance-id: {iid}\nlocal-hostname: {hostname}\n")
            seed = user_data
            if index in self.no_bootcmd:
                text = user_data.decode()
                seed = text[:text.index("\nbootcmd:")].encode() + b"\n"
            (work / "seed" / "user-data").write_bytes(seed)
            (work / "imds" / "user-data").write_bytes(user_data)
            zone = item.get("availabilityZone") or "us-east-1a"
            (work / "imds" / "meta-data.json").write_text(json.dumps({
                "instance-id": iid, "instance-type": item.get("instanceType", ""),
                "ami-id": item.get("imageId", ""), "ami-launch-index": str(index),
                "placement/availability-zone": zone, "placement/region": zone[:-1],
                "local-ipv4": item.get("privateIpAddress", ""), "public-ipv4": address,
                "hostname": hostname, "instance-life-cycle": "spot" if spot else "on-demand",
            }))
            name = f"gpuprov-ec2-{self.session}-{iid}"
            publish = [] if index in self.unreachable else ["-p", f"{address}:22:22"]
            faults = []
            if number in self.broken_bootstrap:
                (work / "facts.d").mkdir(mode=0o755)
                faults = ["-v", f"{work / 'facts.d'}:/etc/ansible/facts.d:ro"]
            from gpuprov.providers.docker import SYSTEMD_FLAGS

            _docker("run", "-d", "--name", name, "--hostname", hostname, "--label", f"{LABEL}={self.session}",
                    *SYSTEMD_FLAGS, "--tmpfs", "/var/lib/docker:rw,exec,size=6g",
                    "-v", f"{work / 'seed'}:/var/lib/cloud/seed/nocloud:ro",
                    "-v", f"{work / 'imds'}:/var/lib/gpuprov-fixture-imds:ro",
                    *publish, *faults, self.image_of(item.get("imageId", "")), "/sbin/init")
            self.instances[iid] = Instance(iid, address, name, work)

    def image_of(self, ami: str) -> str:
        """The Docker image an instance of ``ami`` boots: a baked AMI's commit, an AMI booted as
        another OS, else Debian 12's."""
        return self.amis.get(ami) or self.os_images.get(ami) or self.image

    def terminated(self, ids: list[str]) -> None:
        for iid in ids:
            instance = self.instances.pop(iid, None)
            if instance is not None:
                _docker("rm", "-f", "-v", instance.container, check=False)

    def imaged(self, params: dict[str, str], response: bytes) -> None:
        """A CreateImage answer: the instance's container committed as the AMI's image."""
        import re

        found = re.search(rb"<imageId>(ami-[0-9a-f]+)</imageId>", response)
        instance = self.instances.get(params.get("InstanceId", ""))
        if found is None or instance is None:
            return
        ami = found.group(1).decode()
        tag = f"gpuprov-fixture-ami:{ami}"
        _docker("commit", "--change", 'CMD ["/sbin/init"]', "--change", f"LABEL {LABEL}={self.session}",
                instance.container, tag)
        self.amis[ami] = tag

    def deregistered(self, ami: str) -> None:
        tag = self.amis.pop(ami, None)
        if tag:
            _docker("image", "rm", "-f", tag, check=False)

    def rewrite(self, data: bytes) -> bytes:
        """DescribeInstances: each public address of an emulated instance is its loopback one."""
        if not self.instances or b"<ipAddress>" not in data:
            return data
        from tests.aws.moto_shim import instance_items, xml_bytes

        root, items = instance_items(data)
        for item, iid, address in items:
            if iid is not None and address is not None and iid.text in self.instances:
                address.text = self.instances[iid.text].address
                private = item.find(address.tag.replace("ipAddress", "privateIpAddress"))
                if self.private_on_loopback and private is not None:
                    private.text = address.text
        return xml_bytes(root)

    def console(self, iid: str) -> bytes:
        """GetConsoleOutput: the node's cloud-init console log, as EC2 answers it."""
        instance = self.instances.get(iid)
        text = b""
        if instance is not None:
            text = _docker("exec", instance.container, "cat", "/var/log/cloud-init-output.log", check=False).stdout
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        return (f'<?xml version="1.0" encoding="UTF-8"?><GetConsoleOutputResponse '
                f'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>{uuid.uuid4()}</requestId>'
                f"<instanceId>{iid}</instanceId><timestamp>{now}</timestamp>"
                f"<output>{base64.b64encode(text).decode()}</output></GetConsoleOutputResponse>").encode()

    # -- what tests call -------------------------------------------------------------------
    def boot_as(self, ami: str, codename: str) -> str:
        """Instances of ``ami`` boot Debian ``codename``'s emulated-EC2 image (built here when
        missing or stale), as an official image of that release would."""
        self.os_images[ami] = build_image(self.apt_proxy, codename)
        return self.os_images[ami]

    def post_spot_interruption(self, iid: str, action: str = "terminate") -> dict[str, str]:
        """EC2's two-minute notice, as IMDS serves it at spot/instance-action."""
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2)
        notice = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}
        (self.instances[iid].workdir / "imds" / "spot-instance-action").write_text(json.dumps(notice))
        return notice

    def sh(self, iid: str, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", self.instances[iid].container, "sh", "-c", command],
                              capture_output=True, text=True, check=False, timeout=120)

    def containers(self) -> list[str]:
        out = _docker("ps", "-aq", "--filter", f"label={LABEL}={self.session}").stdout.decode()
        return out.split()

    def close(self) -> None:
        ids = self.containers()
        if ids:
            _docker("rm", "-f", "-v", *ids, check=False)
        self.instances.clear()
        for ami in list(self.amis):
            self.deregistered(ami)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _items(response: bytes) -> list[dict[str, str]]:
    """The instances of a RunInstances answer: id, type, zone, private address, launch index."""
    root = ET.fromstring(response)
    out = []
    for element in root.iter():
        if not element.tag.endswith("instancesSet"):
            continue
        for item in element:
            found: dict[str, str] = {}
            for child in item.iter():
                tag = child.tag.rsplit("}", 1)[-1]
                if tag in ("instanceId", "instanceType", "imageId", "privateIpAddress", "amiLaunchIndex",
                           "availabilityZone") and tag not in found and child.text:
                    found[tag] = child.text
            out.append(found)
    return out
