"""The command registry (gpuprov/cli/registry.py, issue 55): one table says which module of
gpuprov/core/ each command runs; the command imports it only when it runs, so `gpuprov --help`
and click's parsing load none of them (tests/unit/test_startup_imports.py runs them)."""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

import click

from gpuprov.cli.app import cli
from gpuprov.cli.registry import COMMANDS, Command, core

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "gpuprov" / "cli"


def _command(path: list[str]) -> click.Command:
    found: click.Command = cli
    for word in path:
        assert isinstance(found, click.Group) and word in found.commands, f"no command {' '.join(path)}"
        found = found.commands[word]
    return found


def _asked() -> list[tuple[str, int, str, str]]:
    """(file, line, command, attribute) for each ``core("command").attribute`` in gpuprov/cli/."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.value if isinstance(node, ast.Attribute) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "core"
                    and call.args and isinstance(call.args[0], ast.Constant)):
                found.append((path.name, node.lineno, call.args[0].value, node.attr))
    return found


def test_each_row_is_a_command_and_a_module_of_core() -> None:
    assert sorted(typing.get_args(Command)) == sorted(COMMANDS)
    for command, module in COMMANDS.items():
        words = command.split()
        flags = [w for w in words if w.startswith("--")]
        found = _command([w for w in words if not w.startswith("--")])
        assert all(f in {o for p in found.params for o in p.opts} for f in flags), command
        assert module.startswith("gpuprov.core.") and (ROOT / (module.replace(".", "/") + ".py")).is_file()
        assert core(command) is importlib.import_module(module)


def test_what_the_cli_asks_of_a_command_is_there() -> None:
    asked = _asked()
    assert len(asked) > 15 and {c for _, _, c, _ in asked} == set(COMMANDS)
    missing = [f"{f}:{line}: core({c!r}).{attr}" for f, line, c, attr in asked
               if not hasattr(importlib.import_module(COMMANDS[c]), attr)]
    assert missing == []


def test_no_module_of_the_cli_imports_core_itself() -> None:
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n == "gpuprov.core"
                      or n.startswith("gpuprov.core.")]
    assert found == []
