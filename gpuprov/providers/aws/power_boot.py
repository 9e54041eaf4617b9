"""A dynamic node's way into Slurm on AWS (issue 56): what the power service on the controller
gives a node it launches, and how the node gets the one secret it needs.

- **At launch** its user-data (EC2's, readable for the instance's life by anyone allowed
  ``ec2:DescribeInstanceAttribute`` and by any process on the node) carries nothing secret
  that outlives the first minute: the node's hostname (its Slurm name), the power service's
  own login key for a user of its own (``gpuprov-power``, sudo), and a host key made for this
  node and this resume only (*bootstrap*), whose public half the service pins before the
  launch. It is cloud-config written as JSON (cloud-init reads YAML, and JSON is YAML): no
  value of it is ever text of a template.
- **Once the instance runs**, the service connects to its private address over SSH, checked
  strictly against that pinned key, and hands over on stdin what makes the node a dynamic node
  of the cluster: the munge key (0400 munge) and the files of gpuprov.slurm.elastic.node_files
  (slurmd configured by slurmctld, after the node's own quick health). The node's script checks
  the image first (slurmd and munge there: an image baked from a node of the cluster), starts
  munge and slurmd, and then locks the service's login out (its key and its sudo entry gone,
  the user locked): nobody logs in to a dynamic node afterwards, as on local nodes.
- A node that cannot join (no answer on SSH in time, a host key that is not the pinned one, an
  image without Slurm) is named with why, for its Slurm Reason; the service sets it DOWN and
  terminates it.

No key of the operator's and no other node's secret is on the controller or in a user-data:
the service's login key is its own (made on the controller, 0600 root), the munge key the
controller's.
"""

from __future__ import annotations

import io
import ipaddress
import json
import re
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.slurm import elastic

USER = "gpuprov-power"
_NODE = re.compile(r"[a-z][a-z0-9-]{0,39}-" + elastic.DYNAMIC_TAG + r"-[0-9]{1,4}")
_PUBLIC = re.compile(r"ssh-ed25519 [A-Za-z0-9+/]{68}")
_PEM = re.compile(r"-----BEGIN OPENSSH PRIVATE KEY-----\n[A-Za-z0-9+/=\n]+-----END OPENSSH PRIVATE KEY-----\n?")
# The bootstrap key's files, written by bootcmd before sshd starts (cloud-init's own ssh module
# runs later); once per instance.
_BOOTCMD = """set -eu
[ -e /etc/gpuprov/hostkey-installed ] && exit 0
umask 077
mkdir -p /etc/gpuprov /etc/ssh/sshd_config.d
rm -f /etc/ssh/ssh_host_*_key /etc/ssh/ssh_host_*_key.pub
printf '%s' "$1" > /etc/ssh/ssh_host_ed25519_key
printf '%s gpuprov-bootstrap\\n' "$2" > /etc/ssh/ssh_host_ed25519_key.pub
chmod 0600 /etc/ssh/ssh_host_ed25519_key
chmod 0644 /etc/ssh/ssh_host_ed25519_key.pub
printf 'HostKey /etc/ssh/ssh_host_ed25519_key\\n' > /etc/ssh/sshd_config.d/10-gpuprov-hostkey.conf
printf 'bootstrap %s\\n' "$3" > /etc/gpuprov/hostkey-installed
"""
# What the node runs, as root, with the hand-over (a tar archive) on stdin.
_NOT_BAKED = "the image is not one baked from a node of the Slurm cluster"
_UNNAMED = "its user-data did not name it"
JOIN = f"""set -eu
[ "$(hostname -s)" = "$1" ] || {{ echo "this node is $(hostname -s), not $1: {_UNNAMED}" >&2; exit 4; }}
command -v slurmd >/dev/null || {{ echo "slurmd is not installed: {_NOT_BAKED}" >&2; exit 4; }}
id munge >/dev/null 2>&1 || {{ echo "no munge user: {_NOT_BAKED}" >&2; exit 4; }}
umask 077
tar -x -p -C / -f -
chown munge:munge {elastic.MUNGE_KEY}
ln -sf /dev/null /etc/systemd/system/slurmctld.service
systemctl daemon-reload
systemctl restart munge.service
systemctl enable --quiet slurmd.service
systemctl restart slurmd.service
rm -f /home/{USER}/.ssh/authorized_keys
sed -i '/^{USER} /d' /etc/sudoers.d/90-cloud-init-users 2>/dev/null || true
usermod --lock --expiredate 1 {USER}
"""


@dataclass(frozen=True)
class Bootstrap:
    """The host key one node answers with until nobody logs in to it any more."""

    private: str  # OpenSSH PEM
    public: str  # "ssh-ed25519 AAAA..."

    @classmethod
    def new(cls, workdir: Path, node: str) -> Bootstrap:
        private, public = ssh.new_host_key(workdir, f"gpuprov-bootstrap@{node}")
        return cls(private.decode(), " ".join(public.split()[:2]))


def user_data(node: str, login_key: str, bootstrap: Bootstrap, resume: str) -> bytes:
    """The node's cloud-config (module docstring), every value checked before it is written."""
    if not _NODE.fullmatch(node):
        raise GpuprovError(f"node name {node[:60]!r}: not a dynamic node's")
    login = " ".join(login_key.split()[:2])
    if not _PUBLIC.fullmatch(login) or not _PUBLIC.fullmatch(bootstrap.public):
        raise GpuprovError("a login or host key that is not one ed25519 public key")
    if not _PEM.fullmatch(bootstrap.private) or not re.fullmatch(r"[A-Za-z0-9-]{1,64}", resume):
        raise GpuprovError("a bootstrap key that is not one OpenSSH private key, or a resume id that is not one")
    document = {
        "hostname": node, "preserve_hostname": False,
        "ssh_deletekeys": False, "ssh_genkeytypes": ["ed25519"],
        "users": ["default", {"name": USER, "gecos": "gpuprov power service (locked once the node joins)",
                              "shell": "/bin/sh", "sudo": "ALL=(ALL) NOPASSWD:ALL", "lock_passwd": True,
                              "ssh_authorized_keys": [login]}],
        "bootcmd": [["/bin/sh", "-c", _BOOTCMD, "bootcmd", bootstrap.private, bootstrap.public, resume]],
    }
    return ("#cloud-config\n" + json.dumps(document, indent=1) + "\n").encode()


def handover(controller_addr: str, munge_key: bytes) -> bytes:
    """The tar archive the node unpacks: the munge key and elastic.node_files (root's, modes
    set; the script gives the key to munge)."""
    files = [*elastic.node_files(controller_addr, container=False), (elastic.MUNGE_KEY, munge_key, 0o400)]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data, mode in files:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.uid, info.gid, info.mtime = len(data), mode, 0, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def join(address: str, node: str, bootstrap: Bootstrap, key: Path, workdir: Path, archive: bytes,
         deadline_s: float = 600.0) -> None:
    """Connect to the node at ``address`` (its private one) with its pinned bootstrap key, until
    ``deadline_s``, and hand over ``archive``; GpuprovError with the first line of why not."""
    ipaddress.ip_address(address)  # a ValueError for anything else: it becomes known_hosts' line
    if not _NODE.fullmatch(node):
        raise GpuprovError(f"node name {node[:60]!r}: not a dynamic node's")
    known = workdir / f"known_hosts-{node}"
    ssh.pin_host_keys(known, {(address, 22): bootstrap.public})
    command = ["ssh", *ssh.ssh_options(known, key), "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               f"{USER}@{address}", "sudo", "sh", "-c", _quoted(JOIN), "join", node]
    stop, last = time.monotonic() + deadline_s, "no attempt"
    try:
        while True:
            proc = subprocess.run(command, input=archive, capture_output=True, timeout=300, check=False)
            if proc.returncode == 0:
                return
            err = proc.stderr.decode(errors="replace")
            if proc.returncode != 255:  # the script ran and refused: the image's fault, said
                raise GpuprovError(f"join: {printable(err.strip().splitlines()[-1] if err.strip() else '')[:200]} "
                                   f"(exit {proc.returncode})")
            last = ssh.ssh_error_line(err, proc.returncode)
            if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key verification failed" in err:
                raise GpuprovError(f"join: {address} answered with a host key that is not {node}'s pinned one")
            if time.monotonic() > stop:
                raise GpuprovError(f"join: no SSH answer from {address} in {deadline_s:.0f} s ({last})")
            time.sleep(3)
    finally:
        known.unlink(missing_ok=True)


def _quoted(script: str) -> str:
    """``script`` as one word of the remote shell's command line (ssh joins its arguments)."""
    return "'" + script.replace("'", "'\\''") + "'"
