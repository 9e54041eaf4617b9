"""The bootstrap bundle: everything a node needs to bootstrap and verify itself, in one
content-addressed archive.

Layout (a gzip'd tar, byte-for-byte the same for the same inputs: sorted entries, fixed times,
owners and modes, no gzip name or time, so its sha256 names its content)::

    manifest.json            format, gpuprov and ansible-core versions, the lock's hash, tags
                             (and a patch's playbook and check mode)
    site/playbooks/ ...      the playbooks site.yml imports
    site/roles/ ...          the roles (their molecule scenarios left out)
    site/vars.yml            the play variables (`-e @vars.yml`, as push passes them: every
                             string tagged !unsafe, data and never a template)
    site/nodes.json          per node profile: the host variables the push inventory gives
                             such a node, and what its probes expect; and the group variables
    lib/ ...                 ansible-core and the pure-Python packages it and the probes need
                             (jinja2, markupsafe, PyYAML, packaging, resolvelib, pytest,
                             pluggy, iniconfig, pygments, testinfra), and gpuprov (its probes)
    collections/ ...         the collections the roles call (found by their FQCNs)
    plugins/callback/gpuprov_pull.py   the callback that reports each task to the controller

The packages are this controller's own installed copies, so a node runs the plays with the
very ansible-core push uses. Compiled speed-ups (PyYAML's, MarkupSafe's) are left out: each
package falls back to its pure-Python code, whatever the node's Python build. The node needs
Python >= 3.11 (ansible-core's controller floor), which Debian 12 has.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import re
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gpuprov import __version__, paths
from gpuprov.ansible.runner import extravars_yaml, site_plays_for
from gpuprov.errors import GpuprovError
from gpuprov.lock.lock_data import LockData
from gpuprov.manifest import record, remote
from gpuprov.probes.run import groups_of_plays

FORMAT = 1
PATCH_FORMAT = 2  # a bundle that names its playbook and check mode (node/agent.py's FORMATS)
PLAYBOOKS = ("site.yml", "patch.yml")  # what a bundle may run (node/agent.py's own list)
PYTHON_MIN = (3, 11)
# Top-level import names copied into lib/: ansible-core, what it imports, and the probes' runner.
PACKAGES = ("ansible", "jinja2", "markupsafe", "yaml", "packaging", "resolvelib", "pytest",
            "_pytest", "pluggy", "iniconfig", "pygments", "testinfra", "py", "gpuprov")
# ansible-core's one requirement left out: cryptography (compiled; ansible-core imports it for
# vault and password hashing, which no role of gpuprov uses).
NOT_CARRIED = frozenset({"cryptography"})
_SKIP_DIRS = frozenset({"__pycache__", "molecule", ".pytest_cache"})
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so")
_FQCN = re.compile(r"^\s*(?:- )?([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)\.[a-z_][a-z0-9_]*:", re.M)
NODE_DIR = Path(__file__).resolve().parent / "node"


@dataclass(frozen=True)
class Bundle:
    data: bytes
    sha256: str
    manifest: dict[str, Any]
    # Per node profile, the inputs digest of what it converges from (gpuprov.manifest.record:
    # the plays, the run's variables, the scope, the host and group variables), as push computes
    # it from its inventory: a pulled node's manifest is recorded with it.
    inputs: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.data)


def build(*, lock: LockData, extravars: Mapping[str, Any], group: str,
          group_vars: Mapping[str, Any], profiles: Mapping[str, Mapping[str, Any]],
          tags: Sequence[str] = (), playbook: str = "site.yml", check: bool = False) -> Bundle:
    """The bundle for one cluster's bootstrap. ``profiles``: per kind of node (its key is in
    each node's boot configuration), ``hostvars`` (what the push inventory gives such a node)
    and ``expect`` (what its probes expect); ``group``
    and ``group_vars``: the inventory group the nodes are in and its variables. ``playbook``
    and ``check``: a patch's rounds (`patch --via pull`) run patch.yml, its plan in check mode;
    such a bundle is format 2, which an agent from before them refuses."""
    import ansible.release

    if playbook not in PLAYBOOKS:
        raise GpuprovError(f"a pull bundle runs one of {', '.join(PLAYBOOKS)}, not {playbook!r}")

    # The node's inventory (the agent writes it from nodes.json) is read by ansible-core as
    # trusted source, with no way to tag a value: one that looks like a template is refused
    # here (validation keeps such values out of node records; this is the second wall).
    _no_templates({"group_vars": group_vars,
                   "hostvars": {kind: profile.get("hostvars", {}) for kind, profile in profiles.items()}})
    site = playbook == "site.yml" and not check
    manifest = {
        "format": FORMAT if site else PATCH_FORMAT,
        "gpuprov": __version__,
        "ansible_core": ansible.release.__version__,
        "python_min": list(PYTHON_MIN),
        "lock_hash": lock.get("hash"),
        "tags": list(tags),
        # site.yml with --tags: the asked plays' own playbooks, run as push runs them
        # (gpuprov.ansible.runner.site_plays_for); an agent that does not know the key runs
        # site.yml with the same tags, the same tasks.
        **({"plays": [p.name for p in plays]} if site and (plays := site_plays_for(
            paths.playbooks_dir() / "site.yml", list(tags))) else {}),
        # The probes the node runs on itself after the plays: those of the plays it ran (a run of
        # some plays is judged on them, as `verify --only`), every one after the whole site.
        "probes": groups_of_plays(tags),
        "collections": sorted(".".join(c) for c in collections_used()),
        **({} if site else {"playbook": playbook, "check": check}),
    }
    entries: list[tuple[str, bytes, int]] = [("manifest.json", _json(manifest), 0o644)]
    entries += _tree(paths.playbooks_dir(), "site/playbooks")
    entries += _tree(paths.roles_dir(), "site/roles")
    # As push hands them over (gpuprov.ansible.runner.extravars_yaml): every string `!unsafe`,
    # so no value, whatever the cluster's record holds, is a template on the node.
    entries.append(("site/vars.yml", extravars_yaml(extravars).encode(), 0o600))
    entries.append(("site/nodes.json", _json({"group": group, "group_vars": group_vars, "profiles": profiles}), 0o644))
    for name in PACKAGES:
        entries += _package(name)
    for namespace, collection in collections_used():
        entries += _tree(_collection_dir(namespace, collection),
                         f"collections/ansible_collections/{namespace}/{collection}")
    entries.append(("plugins/callback/gpuprov_pull.py", (NODE_DIR / "gpuprov_pull.py").read_bytes(), 0o644))
    data = _archive(entries)
    scope, me = record.scope_of(tags), remote.identity()
    # As push's inventory gives a node its variables (as Ansible merges them): the host's over the group's.
    inputs = {kind: record.inputs_digest(extravars, {**group_vars, **profile.get("hostvars", {})}, scope, me)
              for kind, profile in profiles.items()}
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), manifest=manifest, inputs=inputs)


_TEMPLATE_MARKERS = ("{{", "{%", "{#")


def _no_templates(data: Any, where: str = "") -> None:
    if isinstance(data, Mapping):
        for key, value in data.items():
            _no_templates(key, where)
            _no_templates(value, f"{where}.{key}" if where else str(key))
    elif isinstance(data, list | tuple):
        for number, value in enumerate(data):
            _no_templates(value, f"{where}[{number}]")
    elif isinstance(data, str) and any(marker in data for marker in _TEMPLATE_MARKERS):
        raise GpuprovError(f"the pull bundle's inventory variable {where or '(a name)'} holds a template "
                           f"({data!r}); refused (a node's inventory is no place for one)")


def collections_used() -> list[tuple[str, str]]:
    """The collections the playbooks and roles call by FQCN (``ansible.builtin`` is
    ansible-core's own): none while they call ansible.builtin only, as
    tests/unit/test_builtin_modules.py holds them to (gpuprov depends on ansible-core alone)."""
    found: set[tuple[str, str]] = set()
    for root in (paths.playbooks_dir(), paths.roles_dir()):
        for path in sorted(root.rglob("*.yml")):
            if _SKIP_DIRS.intersection(path.relative_to(root).parts):
                continue
            found.update(_FQCN.findall(path.read_text()))
    found.discard(("ansible", "builtin"))
    return sorted(found)


def _collection_dir(namespace: str, collection: str) -> Path:
    spec = importlib.util.find_spec(f"ansible_collections.{namespace}.{collection}")
    if spec is None or not spec.submodule_search_locations:
        raise GpuprovError(f"the roles call {namespace}.{collection}, which is not installed here "
                           "(the `ansible` package carries it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _package(name: str) -> list[tuple[str, bytes, int]]:
    """A top-level package (or module) and its distribution's metadata (ansible-core reads
    the versions of what it imports)."""
    return _code(name) + [entry for dist in _distributions().get(name, ()) for entry in _metadata(dist)]


@cache
def _distributions() -> Mapping[str, list[str]]:
    from importlib.metadata import packages_distributions

    return packages_distributions()


def _metadata(dist_name: str) -> list[tuple[str, bytes, int]]:
    from importlib.metadata import distribution

    dist = distribution(dist_name)
    out = []
    for file in dist.files or ():
        if file.parts and file.parts[0].endswith(".dist-info") and file.name != "RECORD":
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                out.append((f"lib/{file.as_posix()}", path.read_bytes(), 0o644))
    return out


def _code(name: str) -> list[tuple[str, bytes, int]]:
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise GpuprovError(f"the bootstrap bundle needs the Python package '{name}', which is not "
                           "installed here")
    if spec.submodule_search_locations:
        return _tree(Path(next(iter(spec.submodule_search_locations))), f"lib/{name}")
    assert spec.origin is not None
    return [(f"lib/{name}.py", Path(spec.origin).read_bytes(), 0o644)]


def _tree(root: Path, prefix: str) -> list[tuple[str, bytes, int]]:
    out = []
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
        out.append((f"{prefix}/{rel}", path.read_bytes(), mode))
    return out


def _walk(root: Path) -> Iterator[Path]:
    for path in sorted(root.iterdir()):
        if path.is_symlink():
            continue
        if path.is_dir():
            if path.name not in _SKIP_DIRS:
                yield from _walk(path)
        elif path.is_file() and not path.name.endswith(_SKIP_SUFFIXES):
            yield path


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def _archive(entries: list[tuple[str, bytes, int]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()
