"""A cluster of this machine for the tests that run the real ansible-playbook through
gpuprov.ansible.runner.run_playbook (tests/unit/test_check_would_change.py,
tests/unit/test_site_plays.py): localhost over a local connection, the ansible.cfg gpuprov
writes, and a playbook whose tasks check mode cannot all run (its commands)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuprov import templating
from gpuprov.providers import ClusterFiles

ROOT = Path(__file__).resolve().parents[2]

PLAY = """
- name: Would it change
  hosts: all
  gather_facts: false
  tasks:
    - name: A managed file
      ansible.builtin.copy:
        dest: "%(dir)s/managed"
        content: "1\\n"
        mode: "0644"
    - name: Hold a package by hand
      ansible.builtin.command: "touch %(dir)s/held"
      changed_when: true
    - name: One command per item
      ansible.builtin.command: "touch %(dir)s/{{ item }}"
      loop: [one, two]
      changed_when: true
    - name: A command whose work is done
      ansible.builtin.command: "touch %(dir)s/done"
      args:
        creates: "%(dir)s/done"
    - name: A read that changes nothing
      ansible.builtin.command: "cat %(dir)s/done"
      changed_when: false
    - name: A command its condition leaves out
      ansible.builtin.command: "touch %(dir)s/never"
      when: false
"""


def local_cluster(tmp_path: Path) -> tuple[ClusterFiles, Path]:
    """A cluster of this machine (localhost, a local connection) with the ansible.cfg gpuprov
    writes, and a playbook directory beside it with gpuprov's callback plugins."""
    files = ClusterFiles(tmp_path / "cluster")
    files.dir.mkdir()
    files.inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    # The ansible.cfg gpuprov writes for every cluster (its callbacks line is what is tested).
    files.ansible_cfg.write_text(templating.render("ansible.cfg.j2", {
        "cluster": "check", "inventory": files.inventory, "roles_path": ROOT / "roles", "forks": 5,
        "strategy_plugins": None}))
    book_dir = tmp_path / "playbooks"
    book_dir.mkdir()
    # Beside the playbook, as playbooks/callback_plugins is beside gpuprov's playbooks.
    (book_dir / "callback_plugins").symlink_to(ROOT / "playbooks" / "callback_plugins")
    work = tmp_path / "node"
    work.mkdir()
    (work / "done").write_text("")
    playbook = book_dir / "play.yml"
    playbook.write_text(PLAY % {"dir": work})
    return files, playbook
