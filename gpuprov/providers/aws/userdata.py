"""Host keys made here, handed to the instances through cloud-init user-data.

One RunInstances call gives every instance the same user-data, so it carries
one ed25519 host key per instance of the batch; each instance installs the
one of its launch index (``templates/cloud-init.yaml.j2``). The public halves
are kept in the cluster dir as ``hostkeys/BATCH-INDEX.pub`` and pinned in
known_hosts before the first SSH connection.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

from gpuprov import paths, ssh
from gpuprov.providers import ClusterFiles

# EC2 takes at most 16 KiB of user-data (before base64); cloud-init reads gzip.
USER_DATA_LIMIT = 16 * 1024


@dataclass(frozen=True)
class HostKey:
    private_body: str  # the OpenSSH PEM body on one line (the script re-wraps it)
    public: str  # "ssh-ed25519 AAAA..." without a comment


def host_key_file(files: ClusterFiles, batch: str, index: int) -> Path:
    return files.dir / "hostkeys" / f"{batch}-{index}.pub"


def make_host_keys(files: ClusterFiles, cluster: str, batch: str, count: int) -> list[HostKey]:
    """``count`` fresh host keys; their public halves are written before any launch."""
    directory = files.dir / "hostkeys"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = []
    for index in range(count):
        private, public = ssh.new_host_key(files.dir, f"root@{cluster}-{batch}-{index}")
        host_key_file(files, batch, index).write_text(public + "\n")
        body = "".join(line for line in private.decode().splitlines() if not line.startswith("-----"))
        keys.append(HostKey(body, " ".join(public.split()[:2])))
    return keys


def render(cluster: str, batch: str, user: str, authorized_key: str, host_keys: list[HostKey]) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("cloud-init.yaml.j2").render(
        cluster=cluster, batch=batch, user=user, authorized_key=authorized_key.strip(), host_keys=host_keys
    )


def encode(text: str) -> bytes:
    """The user-data bytes: plain when small enough, gzip otherwise (large batches)."""
    raw = text.encode()
    if len(raw) <= USER_DATA_LIMIT:
        return raw
    packed = gzip.compress(raw, mtime=0)
    if len(packed) > USER_DATA_LIMIT:
        from gpuprov.errors import BadInput

        raise BadInput(
            f"{len(host_keys_in(text))} host keys do not fit in EC2's 16 KiB user-data; "
            "launch fewer nodes per `up` and re-run it to add the rest"
        )
    return packed


def host_keys_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if "key='" in line]
