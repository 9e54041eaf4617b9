"""gpuprov depends on ansible-core alone (pyproject.toml): every task of the roles, the
playbooks and the molecule plays calls an ansible.builtin module (by its FQCN or a builtin's
short name), and no expression calls a collection's filter, lookup or test. A collection used
anywhere would need the `ansible` package (or Galaxy) on every machine that runs the roles."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import ansible.modules
import yaml
from ansible.playbook.block import Block
from ansible.playbook.handler import Handler

ROOT = Path(__file__).resolve().parents[2]
# Where tasks live: the roles (tasks, handlers, their molecule plays), the playbooks, and the
# molecule plays every scenario shares.
SOURCES = (ROOT / "roles", ROOT / "playbooks", ROOT / "tests" / "molecule")
BUILTIN = frozenset(p.stem for p in Path(ansible.modules.__file__).parent.glob("*.py") if p.stem != "__init__")
# A task's keys that are not its module: task and handler keywords, blocks, loops.
KEYWORDS = frozenset(Handler.fattributes) | frozenset(Block.fattributes) | {"local_action"}
PLAY_SECTIONS = ("pre_tasks", "tasks", "post_tasks", "handlers")
# A plugin named by a three-part name in an expression: lookup('a.b.c'), query("a.b.c"),
# `| a.b.c` (filter), `is a.b.c` (test).
_FQCN = r"([a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*)\.[a-z_][a-z0-9_]*"
EXPRESSION_PLUGIN = re.compile(
    rf"(?:\b(?:lookup|query|q)\(\s*['\"]{_FQCN}['\"]|\|\s*{_FQCN}\b|\bis\s+(?:not\s+)?{_FQCN}\b)")


class _Loader(yaml.SafeLoader):
    """YAML as Ansible writes it: !unsafe and !vault values are read as plain strings."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def _module(task: dict) -> str | None:
    if "local_action" in task or "action" in task:
        value = task.get("local_action", task.get("action"))
        return (value.get("module") if isinstance(value, dict) else str(value).split()[0]) or None
    names = [k for k in task if k not in KEYWORDS and not k.startswith("with_")]
    return names[0] if names else None


def _tasks(items: object) -> Iterator[dict]:
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        if "hosts" in item or "import_playbook" in item:  # a play
            for section in PLAY_SECTIONS:
                yield from _tasks(item.get(section))
            continue
        yield item
        for section in ("block", "rescue", "always"):
            yield from _tasks(item.get(section))


def non_builtin(files: list[Path]) -> list[str]:
    """Each use of something that is not ansible-core's own: 'FILE: NAME'."""
    found = []
    for path in files:
        text = path.read_text()
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader
        for task in _tasks(data):
            if {"block", "rescue", "always"} & task.keys():
                continue
            module = _module(task)
            if module is None:
                found.append(f"{path}: a task with no module: {sorted(task)}")
            elif module.startswith("ansible.builtin."):
                if module.removeprefix("ansible.builtin.") not in BUILTIN:
                    found.append(f"{path}: {module}")
            elif module not in BUILTIN:
                found.append(f"{path}: {module}")
        for match in EXPRESSION_PLUGIN.finditer(text):
            collection = next(g for g in match.groups() if g)
            if collection != "ansible.builtin":
                found.append(f"{path}: {match.group(0).strip()}")
    return found


def _files() -> list[Path]:
    return sorted(p for root in SOURCES for p in root.rglob("*.yml") if "__pycache__" not in p.parts)


def test_every_task_calls_a_builtin_module_and_no_collection(tmp_path: Path) -> None:
    # The finder sees each kind of use (so an empty answer below means something).
    sample = tmp_path / "sample.yml"
    sample.write_text(
        "- name: p\n  hosts: all\n  tasks:\n"
        "    - name: a\n      community.general.modprobe: {name: x}\n"
        "    - name: b\n      block:\n        - name: c\n          sysctl: {name: x, value: 1}\n"
        "    - name: d\n      ansible.builtin.copy: {dest: /x, content: \"{{ y | community.general.to_toml }}\"}\n"
        "    - name: e\n      ansible.builtin.debug:\n        msg: !unsafe \"{{ lookup('ansible.posix.x', 'y') }}\"\n"
        "    - name: f\n      ansible.builtin.command: 'true'\n      when: z is community.general.a_test\n"
        "    - name: g\n      ansible.builtin.set_fact: {x: \"{{ lookup('ansible.builtin.env', 'H') | int }}\"}\n"
        "    - name: h\n      copy: {dest: /x, content: y}\n      loop: [1]\n"
        "    - name: i\n      local_action: community.docker.docker_container name=x\n")
    assert [line.split(": ", 1)[1] for line in non_builtin([sample])] == [
        "community.general.modprobe", "sysctl", "community.docker.docker_container",
        "| community.general.to_toml", "lookup('ansible.posix.x'", "is community.general.a_test"]

    files = _files()
    assert len(files) > 50 and any(p.name == "site.yml" for p in files)
    assert non_builtin(files) == []
