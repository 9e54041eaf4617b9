"""`provision --check` tells the truth (issue 53, section 1): check mode skips a command task
(it cannot know what the command does) and Ansible counts it skipped, so a plan said "0
changed" and the real run then changed the node. gpuprov's callback
(playbooks/callback_plugins/gpuprov_check.py, enabled by the ansible.cfg gpuprov writes) names
each such task; run_playbook counts it as a change and names every task that would change. Here
through the real ansible-playbook that push runs (gpuprov.ansible.runner.run_playbook), against
this machine over a local connection: the check's counts and names, then the real run's counts,
which agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuprov import templating
from gpuprov.ansible.runner import WOULD_CHANGE_FILE, read_would_change, run_playbook
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


def _run(files: ClusterFiles, playbook: Path, tmp_path: Path, kind: str, check: bool):
    run_dir = tmp_path / kind
    run_dir.mkdir()
    result = run_playbook(playbook, files, ["localhost"], run_dir, title=kind, check=check)
    assert result.ok, (result.errors, (result.artifact_dir / "stdout").read_text()[-3000:])
    return result, run_dir


def test_check_counts_and_names_what_the_real_run_then_changes(tmp_path: Path) -> None:
    files, playbook = local_cluster(tmp_path)
    planned, run_dir = _run(files, playbook, tmp_path, "check", check=True)
    assert planned.would_change == {"localhost": ["A managed file", "Hold a package by hand",
                                                  "One command per item"]}
    assert planned.hosts["localhost"]["changed"] == 3
    assert not (tmp_path / "node" / "managed").exists() and not (tmp_path / "node" / "held").exists()
    assert (run_dir / WOULD_CHANGE_FILE).is_file()
    done, _ = _run(files, playbook, tmp_path, "real", check=False)
    assert done.hosts["localhost"]["changed"] == planned.hosts["localhost"]["changed"]
    assert done.would_change == {}
    # and converged, the check finds nothing
    again, _ = _run(files, playbook, tmp_path, "again", check=True)
    assert again.hosts["localhost"]["changed"] == 2 and again.would_change == {
        "localhost": ["Hold a package by hand", "One command per item"]}


def test_the_callbacks_file_is_read_as_data(tmp_path: Path) -> None:
    """A line that is not the callback's object, or names a host not in the run, is left out;
    a task name is shown as text (an escape sequence made printable)."""
    path = tmp_path / WOULD_CHANGE_FILE
    path.write_text("\n".join([
        json.dumps({"host": "n1", "task": "Hold \x1b[2J packages"}),
        json.dumps({"host": "elsewhere", "task": "x"}),
        json.dumps(["n1", "list"]),
        "not json",
        json.dumps({"host": "n1", "task": 7}),
    ]) + "\n")
    got = read_would_change(path, {"n1": {}})
    assert list(got) == ["n1"] and len(got["n1"]) == 1 and "\x1b" not in got["n1"][0]
    assert read_would_change(tmp_path / "missing", {"n1": {}}) == {}
