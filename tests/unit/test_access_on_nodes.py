"""The gpuprov_base role's access entry point (issue 57): operators' granted keys present and
revoked ones absent in the login user's authorized_keys, matched by the key's blob, every other
line kept; a second run changes nothing. Run for real on this machine (ansible-playbook, local
connection, no become), the file a temporary one (the entry point's home given as an extra
variable): no node, no molecule."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

CLUSTER = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusterClusterClusterClusterClusterCluster gpuprov-cluster"
ALICE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAliceAliceAliceAliceAliceAliceAliceAlice1 gpuprov-access:alice"
BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBobBobBobBobBobBobBobBobBobBobBobBobBob1 gpuprov-access:bob"


def _run(tmp_path: Path, keys: list[dict[str, str]], check: bool = False) -> int:
    """Changed tasks of one run of the entry point with ``keys``."""
    book = tmp_path / "access.yml"
    book.write_text(yaml.safe_dump([{
        "name": "access", "hosts": "localhost", "gather_facts": False,
        "vars": {"gpuprov_base_access_keys": keys},
        "tasks": [{"name": "access", "ansible.builtin.include_role": {"name": "gpuprov_base", "tasks_from": "access"}}],
    }]))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book),
         "-e", json.dumps({"ansible_user": getpass.getuser(), "__gpuprov_base_access_home": str(tmp_path / "home")}),
         *(["--check", "--diff"] if check else [])],
        capture_output=True, text=True, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "json",
             "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
             "ANSIBLE_PYTHON_INTERPRETER": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    stats = json.loads(proc.stdout[proc.stdout.index("{"):])["stats"]["localhost"]
    return int(stats["changed"])


def test_granted_keys_go_in_revoked_ones_out_and_nothing_else_moves(tmp_path: Path) -> None:
    keys = tmp_path / "home" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(parents=True, mode=0o700)
    keys.write_text(f"{CLUSTER}\n# a site's comment\n")
    granted = [{"name": "alice", "key": ALICE, "state": "present"}, {"name": "bob", "key": BOB, "state": "present"}]
    assert _run(tmp_path, granted) >= 1
    assert keys.read_text() == f"{CLUSTER}\n# a site's comment\n{ALICE}\n{BOB}\n"
    assert keys.stat().st_mode & 0o777 == 0o600
    assert _run(tmp_path, granted) == 0  # converged: nothing to change
    assert _run(tmp_path, granted, check=True) == 0
    # Bob revoked (his grant kept in the record, marked): his line goes, by its blob.
    assert _run(tmp_path, [granted[0], {**granted[1], "state": "absent"}]) == 1
    assert keys.read_text() == f"{CLUSTER}\n# a site's comment\n{ALICE}\n"
    # Bob granted again: one line of his, whatever the list repeats.
    assert _run(tmp_path, granted + granted) >= 1
    assert keys.read_text().count(BOB) == 1
