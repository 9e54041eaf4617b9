"""Every version in one place: the lock (gpuprov/data/stack.toml, resolved by gpuprov.lock.stack) is
the source, roles/gpuprov_lock/vars/main.yml is the one mapping to the roles' variables, and no role,
play or scenario names a version of its own."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from gpuprov.lock import stack
from gpuprov.settings import complete_lock

ROOT = Path(__file__).resolve().parents[2]
MAPPING = ROOT / "roles" / "gpuprov_lock" / "vars" / "main.yml"


def _mapping() -> dict:
    return yaml.safe_load(MAPPING.read_text())


def _role_defaults() -> dict[str, tuple[str, object]]:
    out: dict[str, tuple[str, object]] = {}
    for path in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            out[name] = (path.parent.parent.name, value)
    return out


def test_no_role_depends_on_the_mapping() -> None:
    """A role used alone takes its own defaults: the mapping is the plays' choice, never a
    dependency that would carry it, at role-vars precedence, into a playbook of one's own."""
    for path in sorted(ROOT.glob("roles/*/meta/main.yml")):
        deps = (yaml.safe_load(path.read_text()) or {}).get("dependencies") or []
        names = [d.get("role", d.get("name")) if isinstance(d, dict) else d for d in deps]
        assert "gpuprov_lock" not in names, path
    assert not (ROOT / "roles" / "gpuprov_lock" / "tasks").exists()  # variables only


def test_the_mapping_sets_only_variables_the_roles_have() -> None:
    defaults = _role_defaults()
    public = [name for name in _mapping() if not name.startswith("__")]
    assert public
    unknown = [name for name in public if name not in defaults]
    assert not unknown, f"roles/gpuprov_lock/vars/main.yml sets variables no role has: {unknown}"


def test_every_play_loads_the_mapping_and_runs_gpuprov_base_first() -> None:
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        plays = yaml.safe_load(path.read_text())
        for play in plays:
            if any(key.endswith("import_playbook") for key in play):
                continue
            roles = [r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])]
            assert roles and roles[0] == "gpuprov_base", f"{path.name}: {play['name']} runs {roles}"
            if play.get("vars", {}).get("gpuprov_base_lock_required"):
                # The mapping is the role's vars, read once per play (not vars_files, read
                # again for every task and host).
                assert roles[1] == "gpuprov_lock", f"{path.name}: {play['name']} runs {roles}"
            assert "vars_files" not in play, f"{path.name}: {play['name']}"
            # A play only composes: no task of its own (spot.yml asks the node's metadata
            # service whether it is a spot instance before it picks its role). A role that
            # applies only where a condition holds is an include_role task (skipped as one
            # task where it does not apply, where a role's condition is evaluated on each of
            # its tasks): composition still.
            tasks = play.get("tasks") or []
            assert all(set(task) <= {"name", "ansible.builtin.include_role", "when"}
                       and "ansible.builtin.include_role" in task for task in tasks), path.name
            if path.name != "spot.yml":
                assert not play.get("pre_tasks"), path.name


def _rendered(lock: dict, extra: dict | None = None) -> dict:
    """The mapping as Ansible renders it for ``lock`` (a real ansible-playbook run on the
    controller, no node: the mapping is templated exactly as the plays template it)."""
    public = [name for name in _mapping() if not name.startswith("__")]
    play = [{"name": "render", "hosts": "localhost", "gather_facts": False,
             "roles": ["gpuprov_lock"],
             "tasks": [{"name": "render", "ansible.builtin.debug": {
                 "msg": {name: f"{{{{ {name} }}}}" for name in public}}}]}]
    work = ROOT / ".ruff_cache"  # a writable, ignored place inside the checkout
    work.mkdir(exist_ok=True)
    book = work / f"render-{os.getpid()}.yml"
    book.write_text(yaml.safe_dump(play))
    variables = {"gpuprov_stack": lock, **(extra or {})}
    try:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
             str(book), "-e", json.dumps(variables)],
            capture_output=True, text=True, check=False, timeout=120,
            env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
                 "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"})
    finally:
        book.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    return out["plays"][0]["tasks"][0]["hosts"]["localhost"]["msg"]


@pytest.fixture(scope="module")
def local_node_vars() -> dict:
    """What a local node's lock (the lock molecule scenarios and `make demo` get) maps to."""
    return _rendered(complete_lock(stack.resolve("docker-node", source="distro").as_dict()))


def test_role_defaults_hold_no_version_that_contradicts_the_lock(local_node_vars) -> None:
    defaults = _role_defaults()
    wrong = {}
    for name, value in local_node_vars.items():
        role, default = defaults[name]
        if not _versions_in(json.dumps(default)):
            continue  # no version of its own (empty, a name, or derived from another variable)
        if default != value:
            wrong[name] = (role, default, value)
    assert not wrong, f"role defaults differ from the lock's values (role, default, lock): {wrong}"


def test_the_mapping_follows_the_lock(local_node_vars) -> None:
    lock = stack.resolve("p4d.24xlarge", source="mirror").as_dict()
    got = _rendered(complete_lock(lock), {"gpuprov_mirror_url": "http://10.0.0.5:8080/nvidia/",
                                          "gpuprov_mirror_key_fingerprint": "A" * 40,
                                          "gpuprov_artifact_mirror": "http://10.0.0.5:8081/"})
    assert got["nvidia_driver_version"] == lock["driver"]
    assert got["nvidia_driver_packages"] == lock["packages"]["driver"]
    assert got["nvidia_fabricmanager_version"] == lock["fabricmanager"] == lock["driver"]
    assert got["rdma_efa_installer_version"] == lock["efa_installer"]
    assert got["container_runtime_toolkit_version"] == lock["container_toolkit"]
    # Source mirror: the toolkit from the mirror, trusted through the mirror's key.
    assert got["container_runtime_toolkit_repo_url"] == "http://10.0.0.5:8080/nvidia/libnvidia-container/"
    assert got["container_runtime_toolkit_repo_key_fingerprint"] == "A" * 40
    assert got["cudnn_tarball_url"] == f"http://10.0.0.5:8081/cudnn/{lock['cudnn_archive']}"
    # The site image: named from what goes into it, the same way the probes name it, and kept
    # by a driver move (a patch does not rebuild it).
    from gpuprov.probes.test_containers import _site_image

    assert f"gpuprov/base:{got['base_images_site_tag']}" == _site_image(lock)
    moved = _rendered(complete_lock({**lock, "driver": "580.159.04", "hash": "0" * 12}))
    assert moved["base_images_site_tag"] == got["base_images_site_tag"]
    # A local node: no fabric manager, no EFA, NVIDIA's own toolkit repository.
    assert local_node_vars["nvidia_fabricmanager_version"] == ""
    assert local_node_vars["rdma_efa_installer_version"] == ""
    assert local_node_vars["container_runtime_toolkit_repo_url"] == ""


@functools.cache
def _lock_versions() -> frozenset[str]:
    """Every version, checksum and digest stack.toml pins."""
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.update(re.findall(r"\b\d+\.\d+\.\d+(?:\.\d+)?(?:[-~+][\w.~+]+)?", node))
            found.update(re.findall(r"\b[0-9a-f]{64}\b", node))

    walk(tomllib.loads((ROOT / "gpuprov" / "data" / "stack.toml").read_text()))
    return frozenset(found)


def _versions_in(text: str) -> list[str]:
    return [v for v in _lock_versions() if re.search(rf"(?<![\w.]){re.escape(v)}(?![\w])", text)]


class _SpecLoader(yaml.SafeLoader):
    """Also reads Ansible's `!unsafe` (argument_specs' templated defaults)."""


_SpecLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def _text_to_scan(path: Path) -> str:
    """A file's text; of an argument spec, all but its options' defaults (documentation equal to
    defaults/main.yml's, tests/unit/test_role_argument_specs.py), which are checked as defaults."""
    if path.name != "argument_specs.yml":
        return path.read_text()
    specs = yaml.load(path.read_text(), Loader=_SpecLoader)["argument_specs"]
    for spec in specs.values():
        for option in (spec.get("options") or {}).values():
            option.pop("default", None)
    return json.dumps(specs)


def test_no_version_literal_outside_the_lock() -> None:
    """Tasks, vars, templates, argument specs, plays and scenarios name no version: they take
    it from the lock (role defaults may hold a local node's values for a role used on its
    own, and test_role_defaults_hold_no_version_that_contradicts_the_lock checks them; an
    argument spec's defaults are those same values)."""
    versions = _lock_versions()
    assert "1.17.8" in versions and any(len(v) == 64 for v in versions)
    files = [p for p in [*ROOT.glob("roles/**/*.yml"), *ROOT.glob("roles/**/*.j2"),
                         *ROOT.glob("playbooks/**/*.yml")]
             if p.is_file() and p.relative_to(ROOT).parts[2:] != ("defaults", "main.yml")]
    hits = []
    for path in files:
        hits += [f"{path.relative_to(ROOT)}: {v}" for v in _versions_in(_text_to_scan(path))]
    assert not hits, "versions named outside the lock (take them from the lock instead):\n" + "\n".join(hits)


def test_an_old_lock_is_completed_for_the_plays_and_keeps_what_it_has() -> None:
    """A lock stored before the container roles (no container_toolkit, base_images) gets them
    from today's data for the same request; what it pinned stays (the plays must never move
    a stored driver)."""
    today = stack.resolve("p4d.24xlarge", driver="535", source="nvidia").as_dict()
    old = {k: v for k, v in today.items() if k not in ("container_toolkit", "base_images", "kernel_module")}
    old["driver"] = old["fabricmanager"] = "535.288.01"
    old["hash"] = "0123456789ab"
    done = complete_lock(old)
    assert done["container_toolkit"] == stack.data()["container_toolkit"]["version"]
    assert done["base_images"] and all("@sha256:" in image for image in done["base_images"])
    assert done["driver"] == done["fabricmanager"] == "535.288.01" and done["hash"] == "0123456789ab"


def test_a_lock_todays_data_refuses_is_still_completed() -> None:
    lock = stack.resolve("p4d.24xlarge", driver="535", source="nvidia").as_dict()
    lock = {k: v for k, v in lock.items() if k != "container_toolkit"}
    lock["driver_branch"] = "418"  # a branch no longer pinned: resolving it again is refused
    done = complete_lock(lock)
    assert done["driver_branch"] == "418" and "container_toolkit" in done


def test_the_mapping_names_only_functions_that_exist() -> None:
    """Each `gpuprov.x.y` the mapping's comments point a reader at is a real module attribute."""
    import importlib

    text = MAPPING.read_text()
    names = re.findall(r"\bgpuprov(?:\.[a-z_]+)+", text)
    assert names, "the mapping names no function"
    for dotted in names:
        module, _, attr = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), dotted


def test_gpuprov_base_names_every_lock_os_as_the_nodes_facts_spell_it() -> None:
    """The node-OS check of gpuprov_base (node.yml) knows every OS a lock can name, spelled as the
    facts give it (distribution and major release for Debian, the release for Ubuntu)."""
    from gpuprov import defaults, platforms

    names = yaml.safe_load((ROOT / "roles" / "gpuprov_base" / "vars" / "main.yml").read_text())[
        "__gpuprov_base_lock_os_names"]
    assert list(names) == list(defaults.LOCK_OS)
    for key, spelled in names.items():
        platform = platforms.get(key)
        assert spelled == f"{platform.distribution} {platform.version}", key
