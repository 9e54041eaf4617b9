"""Role variables are documented once, in meta/argument_specs.yml, with their defaults: each
default there is the value defaults/main.yml gives (keys and values), typed as that value, a
template never rendered by Ansible's argument validation (`!unsafe`), and `ansible-doc -t role`
shows the real defaults, not null."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/defaults/main.yml"))
# The Python types a default of each argument spec type may have (ansible-core's type checkers).
TYPES = {"str": (str,), "path": (str,), "bool": (bool,), "int": (int,), "float": (float, int),
         "list": (list,), "dict": (dict,), "raw": (object,)}


class Unsafe(str):
    """A string tagged `!unsafe` in the spec: Ansible never templates it."""


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: Unsafe(loader.construct_scalar(node)))


def _specs(role: str) -> dict:
    text = (ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text()
    return (yaml.load(text, Loader=_Loader) or {}).get("argument_specs") or {}


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def _templated(value) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


@pytest.mark.parametrize("role", ROLES)
def test_main_entry_point_gives_every_default_with_its_value(role: str) -> None:
    defaults = _defaults(role)
    options = _specs(role)["main"].get("options") or {}
    missing = sorted(set(defaults) - set(options))
    assert missing == [], f"role {role}: in defaults/main.yml, not in argument_specs: {missing}"
    extra = sorted(n for n in set(options) - set(defaults) if not options[n].get("required"))
    assert extra == [], f"role {role}: in argument_specs, neither in defaults/main.yml nor required: {extra}"
    differ = {n: (options[n].get("default"), v) for n, v in defaults.items() if options[n].get("default") != v
              or "default" not in options[n]}
    assert differ == {}, f"role {role}: argument_specs default != defaults/main.yml (spec, defaults): {differ}"


def _default_problems(option: dict) -> str | None:
    """What is wrong with an option's default: its type, elements, choices, or a template left to render."""
    value, kind = option["default"], option.get("type", "raw")
    if _templated(value):
        # Ansible templates the spec's options before it validates a role's variables, so a
        # template here would be rendered (and fail where it names a variable not yet set).
        return None if isinstance(value, Unsafe) else "a template not tagged !unsafe"
    if not isinstance(value, TYPES[kind]) or (kind in ("int", "float") and isinstance(value, bool)):
        return f"{value!r} is not of type {kind}"
    elements = option.get("elements")
    if kind == "list" and elements in TYPES and not all(isinstance(item, TYPES[elements]) for item in value):
        return f"an element of {value!r} is not {elements}"
    if option.get("choices") and value not in option["choices"]:
        return f"{value!r} is not among the choices"
    return None


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_gives_the_same_defaults_typed_and_unrendered(role: str) -> None:
    defaults = _defaults(role)
    problems = []
    for entry, spec in _specs(role).items():
        for name, option in (spec.get("options") or {}).items():
            if option.get("required"):
                if "default" in option:
                    problems.append(f"{entry}: {name}: required and a default")
            elif name in defaults and option.get("default", object()) != defaults[name]:
                problems.append(f"{entry}: {name}: default differs from defaults/main.yml")
            elif "default" in option and (problem := _default_problems(option)):
                problems.append(f"{entry}: {name}: {problem}")
    assert problems == [], f"role {role}: {problems}"


def test_ansible_doc_shows_the_real_defaults() -> None:
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    done = subprocess.run([str(ansible_doc), "-t", "role", "-r", str(ROOT / "roles"), "--json", *ROLES],
                          capture_output=True, text=True, check=True, cwd=ROOT, timeout=120)
    shown = json.loads(done.stdout)
    differ = {}
    for role in ROLES:
        options = shown[role]["entry_points"]["main"]["options"]
        for name, value in _defaults(role).items():
            if options.get(name, {}).get("default") != value:
                differ[f"{role}: {name}"] = options.get(name, {}).get("default")
    assert differ == {}, f"ansible-doc shows defaults other than defaults/main.yml's: {differ}"
