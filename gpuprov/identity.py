"""The key gpuprov's own SSH connections log in with: the cluster's key where this machine holds
it, else the operator's own (docs/team-state.md, "Each operator with their own access").

A cluster's private key stays on the machine of the operator who made it (it never goes into
the shared state). Another operator of the team grants their own public key on the cluster
(`gpuprov access grant NAME --key ~/.ssh/id_ed25519.pub --as bob`, applied by the next
`provision`) and names its private half once on their machine: ``GPUPROV_IDENTITY``, else
``identity`` in the settings file (`gpuprov settings --set identity=~/.ssh/id_ed25519`). Every
connection gpuprov makes to a node (Ansible's inventory, the probes, `ssh`, `exec`, health, the
manifests' checks, Slurm's drains) then takes that key where the cluster's is not here. The
host keys stay pinned as always (the team's shared ``known_hosts``).

A path becomes an ``-i`` argument, an inventory value and an ``IdentityFile`` line: it is taken
only as an absolute path of plain characters (no space, quote, brace or ``%``), to a file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuprov.errors import BadInput
from gpuprov.paths import machine_setting

ENV = "GPUPROV_IDENTITY"
KEY = "identity"  # its key in the settings file
# What a key's path may hold: it reaches argv, YAML read by Ansible (templated) and ssh_config.
_PATH = re.compile(r"/[A-Za-z0-9._/+-]{1,4000}")


def parse(value: str, where: str) -> Path | None:
    """``value`` (``~`` expanded) as the operator's key: None where empty; bad input, one line
    naming ``where``, for a path of other characters, a relative one, or one that is no file."""
    value = value.strip()
    if not value:
        return None
    path = os.path.expanduser(value)
    if not _PATH.fullmatch(path) or "/../" in f"{path}/":
        raise BadInput(f"{where} {value!r}: give the absolute path of your private key file "
                       "(letters, digits, '.', '_', '+', '-' and '/' only), as in ~/.ssh/id_ed25519")
    if not Path(path).is_file():
        raise BadInput(f"{where} {value!r}: no such file (your private key: the one whose .pub you granted)")
    if Path(path).name.endswith(".pub"):
        raise BadInput(f"{where} {value!r}: that is a public key; name its private half (without .pub)")
    return Path(path)


def chosen() -> Path | None:
    """The operator's own key: GPUPROV_IDENTITY, else the settings file's, else None."""
    return parse(*machine_setting(KEY, ENV))


def login_key(cluster_key: Path) -> Path:
    """The key a connection to the cluster's nodes logs in with: ``cluster_key`` where this
    machine holds it (the maker's), else the operator's own where one is named, else
    ``cluster_key`` still (its absence is then what the connection reports)."""
    if cluster_key.is_file():
        return cluster_key
    return chosen() or cluster_key
