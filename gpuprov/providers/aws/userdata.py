"""The cloud-init user-data of a launch, and the one bootstrap host key it carries.

EC2 user-data is not secret: anyone allowed ec2:DescribeInstanceAttribute,
and any process on the instance (IMDS), can read it for the instance's whole
life. So it carries no key that a node keeps using. One RunInstances call
gives every instance the same user-data with ONE ed25519 *bootstrap* host
key for the whole launch (``templates/cloud-init.yaml.j2``). Its public half
is kept as ``hostkeys/BATCH-bootstrap.pub`` and pinned in known_hosts before
the first SSH connection, so first contact is still checked strictly; over
that channel every node then makes its own host key and drops the bootstrap
one (``hostkeys.py``), after which the bootstrap private key opens nothing.
"""

from __future__ import annotations

import gzip
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuprov import ssh, templating
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers import ClusterFiles

# EC2 takes at most 16 KiB of user-data (before base64); cloud-init reads gzip.
USER_DATA_LIMIT = 16 * 1024

# A well-formed stand-in for the cluster's login key, for sizing user-data in plan
# (before the real key exists): same type, same length as ssh-keygen's output.
_SIZING_LOGIN_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvUWBaXnRzrFJ6sIa2Dk2yRo4eMUzFybrsZ8GMKkHs0 gpuprov-"


@dataclass(frozen=True)
class HostKey:
    private: str  # the OpenSSH private key, PEM lines
    public: str  # "ssh-ed25519 AAAA..." without a comment


def bootstrap_key_file(files: ClusterFiles, batch: str) -> Path:
    return files.dir / "hostkeys" / f"{batch}-bootstrap.pub"


def legacy_key_file(files: ClusterFiles, batch: str, index: int) -> Path:
    """Per-node keys of launches made before the bootstrap key (also in their user-data)."""
    return files.dir / "hostkeys" / f"{batch}-{index}.pub"


def first_contact_key(files: ClusterFiles, batch: str, launch_index: int) -> Path:
    """The public key a node of ``batch`` answers with before its hand-over."""
    path = bootstrap_key_file(files, batch)
    legacy = legacy_key_file(files, batch, launch_index)
    return legacy if not path.exists() and legacy.exists() else path


def new_bootstrap_key(cluster: str, batch: str) -> HostKey:
    """A fresh ed25519 key, in memory (made in a private temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="gpuprov-hostkey-") as tmp:
        private, public = ssh.new_host_key(Path(tmp), f"gpuprov-bootstrap@{cluster}-{batch}")
    return HostKey(private.decode(), " ".join(public.split()[:2]))


def make_bootstrap_key(files: ClusterFiles, cluster: str, batch: str) -> HostKey:
    """The launch's bootstrap host key; its public half is written before any launch."""
    key = new_bootstrap_key(cluster, batch)
    path = bootstrap_key_file(files, batch)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(key.public + "\n")
    return key


def render(cluster: str, batch: str, user: str, authorized_key: str, bootstrap: HostKey) -> str:
    return templating.render("cloud-init.yaml.j2", {
        "cluster": cluster, "batch": batch, "user": user, "authorized_key": authorized_key.strip(),
        "bootstrap_private": bootstrap.private.strip(), "bootstrap_public": bootstrap.public,
    })


def encode(text: str) -> bytes:
    """The user-data bytes: plain when small enough, gzip otherwise."""
    raw = text.encode()
    if len(raw) <= USER_DATA_LIMIT:
        return raw
    packed = gzip.compress(raw, mtime=0)
    if len(packed) > USER_DATA_LIMIT:
        raise GpuprovError(f"user-data is {len(packed)} bytes gzipped, over EC2's {USER_DATA_LIMIT}")
    return packed


def check_size(cluster: str, user: str) -> int:
    """Refuse in plan (BadInput) what would not fit in EC2's user-data; returns the size.

    The user-data is one document per launch whatever the count (one bootstrap key),
    rendered here with a real-sized key, before anything is created."""
    sizing = new_bootstrap_key(cluster, "00000000")
    text = render(cluster, "00000000", user, _SIZING_LOGIN_KEY + cluster, sizing)
    raw = text.encode()
    size = len(raw) if len(raw) <= USER_DATA_LIMIT else len(gzip.compress(raw, mtime=0))
    if size > USER_DATA_LIMIT:
        raise BadInput(f"the user-data for cluster '{cluster}' would be {size} bytes, over EC2's {USER_DATA_LIMIT}")
    return size


PRIVATE_KEY_MARK = "PRIVATE KEY-----"


def private_keys_in(text: str) -> list[str]:
    """The PEM private keys in a user-data document (tests and audits)."""
    out, current = [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-----BEGIN") and stripped.endswith(PRIVATE_KEY_MARK):
            current = [stripped]
        elif current is not None:
            current.append(stripped)
            if stripped.startswith("-----END"):
                out.append("\n".join(current) + "\n")
                current = None
    return out
