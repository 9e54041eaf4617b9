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
from pathlib import Path

from gpuprov.ansible.runner import WOULD_CHANGE_FILE, read_would_change, run_playbook
from gpuprov.providers import ClusterFiles
from tests.unit.local_cluster import local_cluster


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
