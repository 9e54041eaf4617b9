"""Run a play of roles on a local test node, and commands in it (helpers for tests/roles)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT


def inventory(cdir: Path) -> Path:
    """The cluster's inventory file (inventory.yml; inventory.ini before it)."""
    return next((p for p in (cdir / "inventory.yml", cdir / "inventory.ini") if p.exists()),
                cdir / "inventory.yml")


def play(env, cdir: Path, tmp_path: Path, roles: list[dict],
         tasks: list[dict] | None = None, check: bool = False,
         messages: list[str] | None = None, pci: str | None = None) -> tuple[int, dict, str]:
    """Run a play of ``roles`` (then ``tasks``: e.g. an include_role of one task file) on the
    node; return rc, per-host stats, and all failure messages (with a failed command's stderr).
    ``check``: run with --check --diff. ``messages``: a list that receives every task's msg
    (debug reports included), failed or not. ``pci``: a recorded PCI tree in the node that
    gpuprov_base reads instead of sysfs (its internal test knob, set for the whole play)."""
    book = tmp_path / f"play-{secrets.token_hex(2)}.yml"
    book.write_text(yaml.safe_dump([{
        "name": "roles under test", "hosts": "all", "become": True, "gather_facts": True,
        "vars": {"__gpuprov_base_pci_devices": pci} if pci else {},
        "roles": roles, "tasks": tasks or [],
    }]))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory(cdir)),
         str(book), *(["--check", "--diff"] if check else [])],
        capture_output=True, text=True, check=False,
        env={**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
             "ANSIBLE_ROLES_PATH": str(ROOT / "roles")},
    )
    if "{" not in proc.stdout:
        raise AssertionError(f"ansible-playbook printed no result (rc {proc.returncode}): "
                             f"{proc.stdout[-1500:]} {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    msgs = []
    for p in data["plays"]:
        for t in p["tasks"]:
            for res in t["hosts"].values():
                if messages is not None and res.get("msg"):
                    messages.append(str(res["msg"]))
                if res.get("failed"):
                    msgs.append(str(res.get("msg", "")))
                    for stream in ("stderr", "stdout"):  # over SSH with a tty, a script's stderr is in stdout
                        if res.get(stream):
                            msgs.append(str(res[stream]).strip())
                    for item in res.get("results", []):
                        if isinstance(item, dict) and item.get("failed"):
                            msgs.append(f"{item.get('item')}: {item.get('msg', '')}")
    if not data["stats"]:
        raise AssertionError(f"ansible-playbook reached no host (rc {proc.returncode}): "
                             f"{proc.stderr[-2000:]} {' | '.join(msgs)}")
    stats = next(iter(data["stats"].values()))
    return proc.returncode, stats, " | ".join(msgs)


def sh(cdir: Path, name: str, cmd: str) -> str:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={name}-node-1"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return subprocess.run(["docker", "exec", cid, "sh", "-c", cmd], capture_output=True,
                          text=True, check=False).stdout


def container(name: str) -> str:
    """The docker id of the cluster's (only) node."""
    return subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={name}-node-1"],
                          capture_output=True, text=True, check=True).stdout.strip()


def copy_in(name: str, src: Path, dest: str) -> None:
    """Copy a file or a directory tree from this machine into the node (docker cp)."""
    subprocess.run(["docker", "cp", str(src), f"{container(name)}:{dest}"], capture_output=True,
                   text=True, check=True)
