"""`--tags` runs only the plays asked for (gpuprov.ansible.runner.site_plays_for): site.yml with
``--tags slurm`` parses every play and still runs, in each play not asked for, its roles'
argument validation and base facts (tagged ``always``) on every node. gpuprov hands
ansible-playbook the asked plays' own playbooks instead, in site.yml's order: the same tasks in
the same order for the plays asked for, none of the others. Proven on the real playbooks with
ansible-playbook's own task list, and through run_playbook with the real ansible-playbook on a
small site of three plays against this machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import paths
from gpuprov.ansible import runner
from gpuprov.ansible.runner import run_playbook, site_plays_for
from tests.unit.local_cluster import local_cluster

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "playbooks" / "site.yml"


@pytest.fixture
def fresh_caches():
    """The caches of the site's plays and tags, empty before and after (a test may move the
    playbooks' directory)."""
    for fn in (runner._site_plays, runner._tags_below_plays):
        fn.cache_clear()
    yield
    for fn in (runner._site_plays, runner._tags_below_plays):
        fn.cache_clear()


def test_the_plays_of_the_tags_asked_for_in_site_order(fresh_caches) -> None:
    names = lambda tags: [p.name for p in site_plays_for(SITE, tags) or []]  # noqa: E731
    assert names(["slurm"]) == ["slurm.yml"]
    assert names(["cuda", "driver"]) == ["driver.yml", "cuda.yml"]  # site.yml's order, not the asked one
    assert names(["preflight", "spot", "microcode"]) == ["preflight.yml", "spot.yml", "microcode.yml"]
    # Every selectable tag is a play's: each one selects exactly one playbook of the site.
    assert all(len(names([t])) == 1 for t in runner.known_tags() if t in {t for _, ts in runner._site_plays() for t in ts})
    # Not site.yml, or no tags: the playbook as given.
    assert site_plays_for(ROOT / "playbooks" / "patch.yml", ["slurm"]) is None
    assert site_plays_for(SITE, []) is None


def _listed(args: list[str]) -> dict[str, list[str]]:
    """ansible-playbook --list-tasks: each play's name and its tasks (their listed lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--list-tasks", "-i", "localhost,",
                           *args], capture_output=True, text=True, env=env, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plays: dict[str, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines():
        if m := re.match(r"\s+play #\d+ \([^)]*\): (.*?)\tTAGS: \[(.*)\]$", line):
            current = plays.setdefault(f"{m[1]} [{m[2]}]", [])
        elif current is not None and line.startswith("      ") and line.strip():
            current.append(line.strip())
    return plays


def test_the_asked_plays_list_the_same_tasks_as_site_yml_and_the_others_none(fresh_caches) -> None:
    tags = ["driver", "slurm"]
    whole = _listed(["--tags", ",".join(tags), str(SITE)])
    chosen = _listed(["--tags", ",".join(tags), *map(str, site_plays_for(SITE, tags))])
    asked = {play: tasks for play, tasks in whole.items() if set(tags) & set(play.rsplit("[", 1)[1][:-1].split(", "))}
    assert list(chosen) == list(asked) and chosen == asked
    # What site.yml ran for nothing: the other plays' always-tagged tasks.
    skipped = {play: tasks for play, tasks in whole.items() if play not in asked}
    assert len(skipped) == len(runner._site_plays()) - 2
    assert all(tasks and all("always" in t for t in tasks) for tasks in skipped.values() if tasks), skipped


def test_a_tag_set_below_a_play_keeps_the_whole_site(fresh_caches, tmp_path, monkeypatch) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "playbooks" / "site.yml").write_text(
        "- ansible.builtin.import_playbook: a.yml\n- ansible.builtin.import_playbook: b.yml\n")
    (tmp_path / "playbooks" / "a.yml").write_text("- hosts: all\n  tags: [a]\n  tasks: []\n")
    (tmp_path / "playbooks" / "b.yml").write_text("- hosts: all\n  tags: [b]\n  roles: [r]\n")
    # The role of play b has a task tagged a: --tags a runs it, so the site stays whole.
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text(
        "- ansible.builtin.debug:\n    msg: x\n  tags: [a]\n")
    monkeypatch.setattr(paths, "playbooks_dir", lambda: tmp_path / "playbooks")
    monkeypatch.setattr(paths, "roles_dir", lambda: tmp_path / "roles")
    site = tmp_path / "playbooks" / "site.yml"
    assert site_plays_for(site, ["a"]) is None
    assert [p.name for p in site_plays_for(site, ["b"])] == ["b.yml"]


PLAY = """- name: Play {name}
  hosts: all
  gather_facts: false
  tags: [{name}]
  tasks:
    - name: Mark {name}
      ansible.builtin.copy:
        dest: "{dir}/{name}"
        content: "{name}\\n"
        mode: "0644"
    - name: Seen {name}
      ansible.builtin.set_fact:
        seen_{name}: true
"""


def test_run_playbook_runs_only_the_asked_plays_with_facts_kept_from_play_to_play(fresh_caches, tmp_path,
                                                                                  monkeypatch) -> None:
    files, _ = local_cluster(tmp_path)
    book = tmp_path / "playbooks"
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in "abc":
        (book / f"{name}.yml").write_text(PLAY.format(name=name, dir=marks))
    # The last play reads what the first asked play set: one ansible-playbook run, as site.yml.
    (book / "c.yml").write_text((book / "c.yml").read_text() + """    - name: Facts of the earlier play
      ansible.builtin.assert:
        that: seen_a | default(false)
""")
    (book / "site.yml").write_text("".join(f"- ansible.builtin.import_playbook: {n}.yml\n" for n in "abc"))
    monkeypatch.setattr(paths, "playbooks_dir", lambda: book)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_playbook(book / "site.yml", files, ["localhost"], run_dir, title="plays", tags=["c", "a"])
    assert result.ok, result.errors
    assert sorted(p.name for p in marks.iterdir()) == ["a", "c"]
    assert result.hosts["localhost"]["tasks"] == 5
    command = json.loads((result.artifact_dir / "command").read_text())["command"]
    assert command[-4:] == ["-i", str(files.inventory), str(book / "a.yml"), str(book / "c.yml")], command
    assert str(book / "site.yml") not in command


def test_a_check_run_of_the_asked_plays_names_what_would_change(fresh_caches, tmp_path, monkeypatch) -> None:
    """--check with --tags: gpuprov's check callback (beside the playbooks) still names each
    command check mode skipped that would run, in the asked plays only."""
    files, play = local_cluster(tmp_path)
    book = tmp_path / "playbooks"
    (book / "other.yml").write_text(PLAY.format(name="other", dir=tmp_path / "marks"))
    tagged = play.read_text().replace("  gather_facts: false\n", "  gather_facts: false\n  tags: [would]\n", 1)
    (book / "play.yml").write_text(tagged)
    (book / "site.yml").write_text("- ansible.builtin.import_playbook: other.yml\n"
                                   "- ansible.builtin.import_playbook: play.yml\n")
    monkeypatch.setattr(paths, "playbooks_dir", lambda: book)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_playbook(book / "site.yml", files, ["localhost"], run_dir, title="check", check=True, tags=["would"])
    assert result.ok, result.errors
    assert result.would_change == {"localhost": ["A managed file", "Hold a package by hand", "One command per item"]}
    command = json.loads((result.artifact_dir / "command").read_text())["command"]
    assert command[-1] == str(book / "play.yml") and str(book / "other.yml") not in command
