"""Every role has the same anatomy: inputs Ansible validates (meta/argument_specs.yml, in step
with defaults/main.yml), a README, a molecule scenario, and handlers whose names and listen
topics are unique across all roles (any play may load any of them together)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.name for p in (ROOT / "roles").glob("*/tasks"))
# The argument spec types ansible-core knows (ansible.module_utils.common.parameters).
SPEC_TYPES = {"str", "list", "dict", "bool", "int", "float", "path", "raw", "jsonarg", "json", "bytes", "bits"}
# "Subject | action": the subject names the role's concern (e.g. "Docker", "NVIDIA driver").
HANDLER_NAME = re.compile(r"^(?P<subject>[A-Z][A-Za-z0-9 ]*[A-Za-z0-9]) \| \S")
TASK_LISTS = ("block", "rescue", "always")


class _Loader(yaml.SafeLoader):
    """Also reads Ansible's `!unsafe` (a string never templated: argument_specs' templated defaults)."""


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def _yaml(path: Path):
    return yaml.load(path.read_text(), Loader=_Loader)


def _walk(tasks) -> list[dict]:
    """Every task of a task list, blocks opened."""
    found = []
    for task in tasks or []:
        found.append(task)
        for key in TASK_LISTS:
            found.extend(_walk(task.get(key)))
    return found


def _specs(role: str) -> dict:
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    if not path.is_file():
        pytest.fail(f"role {role} has no meta/argument_specs.yml")
    return (_yaml(path) or {}).get("argument_specs") or {}


def _defaults(role: str) -> dict:
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return (_yaml(path) or {}) if path.exists() else {}


def _handlers(role: str) -> list[dict]:
    return [h for path in sorted((ROOT / "roles" / role / "handlers").glob("*.yml"))
            for h in _walk(_yaml(path))]


def _listens(handler: dict) -> list[str]:
    listen = handler.get("listen", [])
    return [listen] if isinstance(listen, str) else list(listen)


def _notified(tasks) -> list[str]:
    targets = []
    for task in _walk(tasks):
        notify = task.get("notify", [])
        targets.extend([notify] if isinstance(notify, str) else notify)
    return targets


@pytest.mark.parametrize("role", ROLES)
def test_role_has_specs_readme_and_scenario(role: str) -> None:
    base = ROOT / "roles" / role
    missing = [p for p in ("meta/argument_specs.yml", "README.md", "molecule/default/molecule.yml")
               if not (base / p).is_file()]
    assert missing == [], f"role {role} lacks {missing}"
    readme = (base / "README.md").read_text()
    for heading in ("## Variables", "## Example"):
        assert heading in readme, f"roles/{role}/README.md has no '{heading}' section"


@pytest.mark.parametrize("role", ROLES)
def test_argument_spec_main_describes_exactly_the_defaults(role: str) -> None:
    specs = _specs(role)
    assert "main" in specs, f"role {role}: no 'main' entry point"
    options = specs["main"].get("options") or {}
    defaults = _defaults(role)
    assert sorted(set(defaults) - set(options)) == [], f"role {role}: defaults without an argument spec"
    assert sorted(set(options) - set(defaults)) == [], f"role {role}: argument spec without a default"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_has_a_type_a_description_and_list_elements(role: str) -> None:
    defaults = _defaults(role)
    problems = []
    for entry, spec in _specs(role).items():
        assert spec.get("short_description"), f"role {role}: entry point {entry} has no short_description"
        for name, option in (spec.get("options") or {}).items():
            where = f"{entry}: {name}"
            if option.get("type") not in SPEC_TYPES:
                problems.append(f"{where}: type {option.get('type')!r}")
            if not option.get("description"):
                problems.append(f"{where}: no description")
            if option.get("type") == "list" and not option.get("elements"):
                problems.append(f"{where}: a list without elements")
            if option.get("choices") and name in defaults and defaults[name] not in option["choices"]:
                problems.append(f"{where}: the default {defaults[name]!r} is not among the choices")
            if option.get("required") and "default" in option:
                problems.append(f"{where}: required and a default")
    assert problems == [], f"role {role}: {problems}"


@pytest.mark.parametrize("role", ROLES)
def test_other_entry_points_are_task_files_with_known_variables(role: str) -> None:
    defaults = _defaults(role)
    for entry, spec in _specs(role).items():
        if entry == "main":
            continue
        assert (ROOT / "roles" / role / "tasks" / f"{entry}.yml").is_file(), (
            f"role {role}: entry point {entry} has no tasks/{entry}.yml")
        unknown = sorted(set(spec.get("options") or {}) - set(defaults))
        assert unknown == [], f"role {role}: entry point {entry} names variables without a default: {unknown}"


def _tasks_from_calls(with_action: bool = False) -> list[tuple]:
    """(file, role, tasks_from) of every include_role/import_role with tasks_from in the repository's YAML
    (and the action, include_role or import_role, with ``with_action``)."""
    calls = []
    for path in sorted([*(ROOT / "roles").glob("*/tasks/*.yml"), *(ROOT / "playbooks").glob("*.yml")]):
        data = _yaml(path)
        plays = data if isinstance(data, list) else []
        if path.parent.name == "tasks":  # a role's task file: a list of tasks
            tasks = _walk(plays)
        else:  # a playbook: a list of plays
            tasks = [t for play in plays if isinstance(play, dict)
                     for key in ("pre_tasks", "tasks", "post_tasks", "handlers") for t in _walk(play.get(key))]
        for task in tasks:
            for action in ("include_role", "import_role"):
                args = task.get(f"ansible.builtin.{action}") or task.get(action)
                if isinstance(args, dict) and "tasks_from" in args:
                    call = (str(path.relative_to(ROOT)), args["name"], args["tasks_from"])
                    calls.append((*call, action) if with_action else call)
    return calls


# Entry points without an argument spec, on purpose (roles/gpuprov_base/meta/argument_specs.yml
# says why): each use would cost a validation task per node; the roles import them.
UNSPECCED = {("gpuprov_base", "packages_state"), ("gpuprov_base", "apt_lists_age")}


def test_every_tasks_from_has_its_entry_point() -> None:
    # Ansible validates a tasks_from call against the entry point of exactly that name (none:
    # no validation), so "tasks_from: x.yml" would skip the spec of entry point x.
    def entry_points(role: str) -> set[str]:
        path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
        return set((_yaml(path) or {}).get("argument_specs") or {}) if path.is_file() else set()

    missing = [(where, role, entry) for where, role, entry in _tasks_from_calls()
               if entry not in entry_points(role) and (role, entry) not in UNSPECCED]
    assert missing == [], f"tasks_from without an entry point of that name (file, role, tasks_from): {missing}"
    assert not {entry for role, entry in UNSPECCED} & entry_points("gpuprov_base")
    assert all((ROOT / "roles" / role / "tasks" / f"{entry}.yml").is_file() for role, entry in UNSPECCED)


def test_the_unspecced_entry_points_are_imported_never_included() -> None:
    # Their saving is the include's task run: a dynamic include of them costs it again.
    included = [(where, role, entry) for where, role, entry, action in _tasks_from_calls(with_action=True)
                if (role, entry) in UNSPECCED and action != "import_role"]
    assert included == [], f"include_role of an entry point the roles import: {included}"
    assert len(_tasks_from_calls()) > len(UNSPECCED)


def test_handler_names_and_topics_are_unique_across_roles() -> None:
    owners: dict[str, set[str]] = {}
    names = Counter()
    for role in ROLES:
        for handler in _handlers(role):
            names[handler["name"]] += 1
            for label in [handler["name"], *_listens(handler)]:
                owners.setdefault(label, set()).add(role)
    assert [n for n, count in names.items() if count > 1] == [], "handler names defined twice"
    assert {label: sorted(roles) for label, roles in owners.items() if len(roles) > 1} == {}, (
        "a handler name or listen topic used by two roles")


def test_each_role_names_its_handlers_and_topics_after_one_subject_of_its_own() -> None:
    subjects: dict[str, str] = {}
    for role in ROLES:
        for handler in _handlers(role):
            for label in [handler["name"], *_listens(handler)]:
                match = HANDLER_NAME.match(label)
                assert match, f"role {role}: '{label}' is not 'Subject | action'"
                subject = match.group("subject")
                assert subjects.setdefault(subject, role) == role, (
                    f"subject '{subject}' used by roles {subjects[subject]} and {role}")
    role_of = {}
    for subject, role in subjects.items():
        assert role_of.setdefault(role, subject) == subject, f"role {role} uses subjects {role_of[role]}, {subject}"


@pytest.mark.parametrize("role", ROLES)
def test_every_notify_of_a_role_reaches_its_own_handlers(role: str) -> None:
    labels = {label for h in _handlers(role) for label in [h["name"], *_listens(h)]}
    unreached = [(path.name, target) for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml"))
                 for target in _notified(_yaml(path)) if target not in labels]
    assert unreached == []


def test_every_notify_of_a_playbook_reaches_a_handler() -> None:
    labels = {label for role in ROLES for h in _handlers(role) for label in [h["name"], *_listens(h)]}
    unreached = []
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        plays = [p for p in _yaml(path) or [] if isinstance(p, dict)]
        own = {label for play in plays for h in _walk(play.get("handlers"))
               for label in [h["name"], *_listens(h)]}
        for play in plays:
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                unreached += [(path.name, t) for t in _notified(play.get(key)) if t not in labels | own]
    assert unreached == []


# The apt module under every name a task may use for it.
APT_MODULES = ("ansible.builtin.apt", "ansible.legacy.apt", "apt")


def _apt_tasks(role: str) -> list[tuple[str, str, dict]]:
    found = []
    for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
        for task in _walk(_yaml(path)):
            for module in APT_MODULES:
                if module in task:
                    found.append((path.name, task.get("name", "?"), task[module]))
    return found


def test_the_apt_task_finder_sees_the_stack_roles_apt_tasks() -> None:
    """The check below would pass vacuously if it found no apt tasks at all."""
    assert {r for r in ROLES if _apt_tasks(r)} >= {"gpu_preflight", "nvidia_driver", "cuda", "rdma"}


@pytest.mark.parametrize("role", ROLES)
def test_every_apt_task_waits_for_the_dpkg_lock(role: str) -> None:
    """apt-daily and unattended-upgrades run soon after a first boot and hold the dpkg lock for
    minutes; the apt module waits only 60 s by default. Every apt task names its wait, from a
    role variable (a public knob or an internal __role_ one), so a new task without one fails here."""
    problems = []
    for file, name, args in _apt_tasks(role):
        timeout = args.get("lock_timeout") if isinstance(args, dict) else None
        if timeout is None:
            problems.append(f"{file}: '{name}' has no lock_timeout")
        elif not re.fullmatch(r"\{\{ (__)?" + role + r"_apt_lock_timeout \}\}", str(timeout)):
            problems.append(f"{file}: '{name}' lock_timeout {timeout!r} is not the role's *_apt_lock_timeout")
    assert problems == [], f"role {role}: {problems}"
    if _apt_tasks(role):
        known = {**_defaults(role), **(_yaml(ROOT / "roles" / role / "vars" / "main.yml") or {}
                                      if (ROOT / "roles" / role / "vars" / "main.yml").is_file() else {})}
        names = {f"{role}_apt_lock_timeout", f"__{role}_apt_lock_timeout"} & set(known)
        assert names, f"role {role}: no {role}_apt_lock_timeout default or __{role}_apt_lock_timeout var"
        assert all(isinstance(known[n], int) and known[n] >= 60 for n in names), (
            f"role {role}: the lock timeout must be whole seconds, at least apt's own 60")
