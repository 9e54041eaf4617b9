"""benchmarks/run_profile.py reads what ansible-runner really records: a real run of a small
local playbook (a looped task and a slow one), then its profile."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import ansible_runner

ROOT = Path(__file__).parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("run_profile", ROOT / "benchmarks" / "run_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_real_runs_time_is_read_per_role_and_task(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "p.yml").write_text("""---
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Loop
      ansible.builtin.command: "true"
      loop: [1, 2, 3]
      changed_when: false
    - name: Slow
      ansible.builtin.command: sleep 1.2
      changed_when: false
    - name: Never here
      ansible.builtin.command: "false"
      when: false
""")
    run = ansible_runner.run(private_data_dir=str(tmp_path), playbook="p.yml", ident="ansible", quiet=True,
                             envvars={"ANSIBLE_LOCALHOST_WARNING": "False",
                                      "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert run.rc == 0, run.stdout.read()
    report = _module().profile(tmp_path, top=5)
    host = report["hosts"]["localhost"]
    assert host["task_results"] == 3  # the loop counts once, by its own result
    # the skipped task, counted by the file it is in (a play here, not a role's)
    assert host["skipped"] == 1
    assert host["skipped_by_file"] == {str(tmp_path / "project" / "p.yml"): 1}
    tasks = host["slowest_tasks"]
    assert [t["s"] for t in tasks] == sorted((t["s"] for t in tasks), reverse=True), tasks
    # which of the two is slower depends on the machine's load (three forks of `true` against
    # one sleep), so each is found by name and held to what it cannot be below
    by_name = {t["task"]: t for t in tasks}
    assert set(by_name) == {"Slow", "Loop", "Never here"}, tasks
    slow, loop = by_name["Slow"], by_name["Loop"]
    assert 1.2 <= slow["s"] < 30, slow
    assert 0 < loop["s"] < 30, loop
    assert list(host["roles_s"]) == ["(play)"]  # tasks of the play itself, no role
    # each figure is rounded to 0.1 s on its own: the total and the sum of the two may differ by
    # up to three half-tenths
    assert abs(host["roles_s"]["(play)"] - (slow["s"] + loop["s"])) <= 0.15 + 1e-9
    assert report["wall_s"] >= slow["s"]
