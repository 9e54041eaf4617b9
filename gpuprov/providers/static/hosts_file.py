"""A hosts file, read as Ansible reads it, then checked field by field.

Two kinds of file:

- gpuprov's YAML: ``hosts: [{name, address, ...}]`` with defaults (and ``known_hosts``) at
  the top. Every key in it is gpuprov's: an unknown one is refused with the closest known.
- An Ansible inventory, INI or YAML: read by ansible-core's InventoryManager with Ansible's
  own ``yaml`` and ``ini`` inventory plugins only (never script, auto or constructed, whatever
  ansible.cfg or ANSIBLE_* say; no vars plugins), so groups, ``[g:vars]`` (for g's hosts only),
  children and host ranges (``gpu[01:04]``) mean what they mean to Ansible. gpuprov then uses
  a host's merged variables: its own names and Ansible's connection names (FIELDS). Other
  ``ansible_*`` variables are Ansible's and left alone; a ``gpuprov_*`` name gpuprov does not
  know, or another name one typo away from one of gpuprov's, is refused.

Values from Ansible carry its data tags (ansible-core 2.19); they are turned into plain
str/int first, then every field passes gpuprov.validate: nothing read here becomes an option,
inventory syntax or a template.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible
from ansible import constants as ansible_constants
from ansible.errors import AnsibleError
from ansible.inventory.data import InventoryData
from ansible.inventory.helpers import get_group_vars
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader
from ansible.utils.vars import combine_vars

from gpuprov import catalog, validate
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.providers.static import inventory_shape

HOST_KEY = re.compile(r"(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/]+={0,3}")

# gpuprov's fields and the names that give them, first found wins (a host's own value before
# a default or group value): gpuprov's name, then Ansible's, then Ansible's older alias.
FIELDS: dict[str, tuple[str, ...]] = {
    "address": ("address", "ansible_host", "ansible_ssh_host"),
    "user": ("user", "ansible_user", "ansible_ssh_user"),
    "port": ("port", "ansible_port", "ansible_ssh_port"),
    "key": ("key", "ansible_ssh_private_key_file", "ansible_private_key_file"),
    "instance_type": ("instance_type", "gpuprov_instance_type"),
    "gpus": ("gpus", "gpuprov_gpus"),
    "host_key": ("host_key", "gpuprov_host_key"),
    # The site's free-space floor for this host's root filesystem (roles/gpu_preflight; 40 GiB
    # unless the host says otherwise: an on-prem machine with a small root and /var elsewhere).
    "root_free_gib": ("root_free_gib", "gpu_preflight_root_free_gib"),
    # Keep the packages apt downloads after dpkg installed them (roles/gpu_preflight removes them).
    "apt_keep_downloads": ("apt_keep_downloads", "gpu_preflight_apt_keep_downloads"),
}
KNOWN = frozenset(name for names in FIELDS.values() for name in names)
# Set by Ansible on every host it reads; not the user's.
ANSIBLE_SET = frozenset({"inventory_file", "inventory_dir"})
YAML_SUFFIXES = (".yml", ".yaml", ".json")
PLUGINS = ("yaml", "ini")  # tried in Ansible's default order


@dataclass(frozen=True)
class StaticHost:
    name: str
    address: str
    user: str
    port: int
    key: str | None
    instance_type: str | None
    gpus: int | None
    host_key: str | None
    root_free_gib: int | None = None
    apt_keep_downloads: bool | None = None


def parse_hosts_file(path: str | None) -> tuple[list[StaticHost], Path | None]:
    """Read a hosts file; BadInput (one line: the file, the host, the field) when it is not usable."""
    if not path:
        raise BadInput("the static provider needs --hosts FILE (YAML or INI inventory)")
    file = Path(path).expanduser()
    if not file.is_file():
        raise BadInput(f"hosts file {path} not found")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise BadInput(f"hosts file {path} cannot be read ({exc.strerror})") from None
    if b"\0" in raw:
        raise BadInput(f"hosts file {path} is not a text file (NUL bytes; UTF-16 or binary?): "
                       "save it as UTF-8 YAML or INI")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"hosts file {path} is not UTF-8 text (byte {exc.start})") from None

    loader = DataLoader()
    data = _yaml_or_none(loader, file, text, path)
    if isinstance(data, Mapping) and isinstance(data.get("hosts"), list):
        hosts, known = _gpuprov_yaml(_plain(data, f"hosts file {path}"), path)
    else:
        if file.suffix in YAML_SUFFIXES and not isinstance(data, Mapping):
            raise BadInput(f"hosts file {path} is malformed: expected a mapping at the top "
                           "(gpuprov's 'hosts:' list, or an Ansible inventory's groups such as 'all:')")
        if isinstance(data, Mapping):
            inventory_shape.check(_plain(data, f"hosts file {path}"), f"hosts file {path}", KNOWN | {"known_hosts"})
        hosts, known = _ansible_inventory(loader, file, path, yaml_mapping=isinstance(data, Mapping)), None
    if not hosts:
        raise BadInput(f"hosts file {path} lists no hosts")
    names = [h.name for h in hosts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadInput(f"hosts file {path} lists {', '.join(dupes)} more than once")
    ends = [(h.address, h.port) for h in hosts]
    same = sorted({f"{a}:{p}" for a, p in ends if ends.count((a, p)) > 1})
    if same:
        raise BadInput(f"hosts file {path}: {', '.join(same)} is listed for more than one host")
    for h in hosts:
        if h.key and not Path(h.key).expanduser().is_file():
            raise BadInput(f"hosts file {path}: key {h.key} for {h.name} not found")
    return hosts, known


def _yaml_or_none(loader: DataLoader, file: Path, text: str, path: str) -> Any:
    """The file as YAML (Ansible's loader: data only, nothing trusted as a template) when it may
    be YAML; a YAML error in a YAML-named file keeps its line and column."""
    looks_yaml = file.suffix in YAML_SUFFIXES or text.lstrip().startswith(("hosts:", "all:", "---"))
    if not (looks_yaml or not file.suffix):
        return None
    try:
        return loader.load(text, file_name=str(file.resolve()))  # Ansible's origins need an absolute path
    except AnsibleError as exc:
        if not looks_yaml:
            return None  # no suffix: maybe INI, as Ansible would try next
        raise BadInput(f"hosts file {path} is malformed: {_reason(exc)}{_at(exc)}") from None


def _gpuprov_yaml(data: dict[str, Any], path: str) -> tuple[list[StaticHost], Path | None]:
    where = f"hosts file {path}"
    _known_keys(data, KNOWN | {"hosts", "known_hosts"}, where)
    known = data.get("known_hosts")
    if known is not None:
        validate.text(known, f"{where}: known_hosts")
    known_path = Path(known).expanduser() if known else None
    if known_path is not None and not known_path.is_file():
        raise BadInput(f"{where}: known_hosts {known} not found")
    defaults = {k: v for k, v in data.items() if k not in ("hosts", "known_hosts")}
    hosts = []
    for i, item in enumerate(data["hosts"]):
        if not isinstance(item, dict) or "name" not in item:
            raise BadInput(f"{where} is malformed: host #{i + 1} has no name")
        name = validate.host_name(item["name"], where)
        _known_keys(item, KNOWN | {"name"}, f"{where}: host {name}")
        hosts.append(_host(name, [item, defaults], where))
    return hosts, known_path


def _ansible_inventory(loader: DataLoader, file: Path, path: str, *, yaml_mapping: bool) -> list[StaticHost]:
    where = f"hosts file {path}"
    inventory = _HostsFileInventory(loader, str(file.resolve()))
    if inventory.failures:
        # The plugin the file was meant for: YAML when it loaded as a mapping, else the last tried.
        plugin, exc, line = next((f for f in inventory.failures if f[0] == "yaml"), inventory.failures[0]) \
            if yaml_mapping else inventory.failures[-1]
        at = f" (line {line})" if line else _at(exc)
        raise BadInput(f"{where} is malformed ({plugin} inventory): {_reason(exc)}{at}")
    hosts = []
    for host in inventory.hosts.values():
        name = validate.host_name(_plain(host.name, where), where)
        merged = combine_vars(get_group_vars(host.get_groups()), host.vars)
        values = _plain({k: v for k, v in merged.items() if k not in ANSIBLE_SET}, f"{where}: host {name}")
        _ansible_keys(values, f"{where}: host {name}")
        hosts.append(_host(name, [values], where))
    return hosts


def _host(name: str, sources: list[dict[str, Any]], where: str) -> StaticHost:
    """One host, every field checked: each value reaches ssh and Ansible as data of one known
    shape, never as an option, inventory syntax or a template."""
    at = f"{where}: host {name}"

    def pick(field: str) -> tuple[str, Any]:
        for source in sources:
            for k in FIELDS[field]:
                if source.get(k) not in (None, ""):
                    return k, source[k]
        return field, None

    field, address = pick("address")
    address = validate.address(address if address is not None else name, f"{at}: {field}")
    field, user = pick("user")
    if user is None:
        raise BadInput(f"{at}: no user (set user: or ansible_user)")
    user = validate.user_name(user, f"{at}: {field}")
    field, port = pick("port")
    port = 22 if port is None else validate.port(port, f"{at}: {field}")
    field, gpus = pick("gpus")
    gpus = None if gpus is None else validate.count(gpus, f"{at}: {field}")
    field, free = pick("root_free_gib")
    free = None if free is None else validate.count(free, f"{at}: {field}")
    field, keep = pick("apt_keep_downloads")
    keep = None if keep is None else validate.flag(keep, f"{at}: {field}")
    field, key = pick("key")
    key = None if key is None else validate.text(key, f"{at}: {field}")
    field, itype = pick("instance_type")
    itype = None if itype is None else _known_type(validate.instance_type(itype, f"{at}: {field}"),
                                                   f"{at}: {field}")
    field, host_key = pick("host_key")
    if host_key is not None:
        host_key = " ".join(validate.text(host_key, f"{at}: {field}").split()[:2])
        if not HOST_KEY.fullmatch(host_key):
            raise BadInput(f"{at}: {field} must be 'TYPE BASE64' as in known_hosts "
                           f"(ssh-keyscan prints it), not {host_key!r}")
    return StaticHost(name=name, address=address, user=user, port=port, key=key,
                      instance_type=itype, gpus=gpus, host_key=host_key, root_free_gib=free,
                      apt_keep_downloads=keep)


def _known_type(name: str, where: str) -> str:
    """An instance type the catalog knows (the lock is resolved for it), refused naming the host."""
    try:
        catalog.get(name)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None
    return name


def _known_keys(data: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
    """gpuprov's own YAML: every key is gpuprov's, so an unknown one is a mistake to show."""
    for key in data:
        if key not in allowed:
            raise BadInput(f"{where}: unknown key {_unknown(key, allowed)}")


def _ansible_keys(values: Mapping[str, Any], where: str) -> None:
    """An Ansible inventory also holds Ansible's variables and the user's own: refused are a
    gpuprov_* name gpuprov does not know, a name one typo from gpuprov's (``adress``), and an
    ansible_* name one typo from the ones gpuprov reads that Ansible does not know either."""
    ansible_names = {n for names in ansible_constants.MAGIC_VARIABLE_MAPPING.values() for n in names}
    bare = [n for n in KNOWN if not n.startswith(("ansible_", "gpuprov_"))]
    ours = [n for n in KNOWN if n.startswith("ansible_")]
    for key in values:
        if key in KNOWN:
            continue
        if key.startswith("gpuprov_"):
            raise BadInput(f"{where}: unknown key {_unknown(key, KNOWN)}")
        if key.startswith("ansible_"):
            close = difflib.get_close_matches(key, ours, n=1, cutoff=0.9)
            if close and key not in ansible_names:
                raise BadInput(f"{where}: unknown key {key}: did you mean {close[0]}?")
        elif difflib.get_close_matches(key, bare, n=1, cutoff=0.75):
            raise BadInput(f"{where}: unknown key {_unknown(key, bare)}")


def _unknown(key: str, allowed: frozenset[str] | set[str] | list[str]) -> str:
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    if close:
        return f"{key}: did you mean {close[0]}?"
    return f"{key} (known: {', '.join(sorted(allowed))})"


def _plain(value: Any, where: str) -> Any:
    """Ansible's tagged values (2.19 data tagging: origin, trust) as plain Python values."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    raise BadInput(f"{where}: a value gpuprov cannot read as text or a number "
                   f"({type(value).__name__}: vault-encrypted?)")


def _reason(exc: BaseException) -> str:
    """The innermost message of an Ansible error, one line."""
    while isinstance(exc.__cause__, AnsibleError | ValueError | TypeError | KeyError):
        exc = exc.__cause__
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return text.strip().splitlines()[0]


def _at(exc: BaseException | None) -> str:
    """' (line L, column C)' from the innermost Ansible error that knows them."""
    while exc is not None:
        origin = getattr(exc, "obj", None)
        line = getattr(origin, "line_num", None)
        if line:
            column = getattr(origin, "col_num", None)
            return f" (line {line}, column {column})" if column else f" (line {line})"
        exc = exc.__cause__
    return ""


def _ansible_plugin(name: str) -> Any:
    """Ansible's own inventory plugin NAME, and only it: a plugin of that name found first on a
    configured plugin path is refused before it is imported (a hosts file never runs code)."""
    own = Path(ansible.__file__).parent / "plugins" / "inventory" / f"{name}.py"
    found = inventory_loader.find_plugin(name)
    if found is None or Path(found).resolve() != own.resolve():
        raise GpuprovError(f"reading hosts files needs Ansible's own {name} inventory plugin, "
                           f"but {found or 'nothing'} is found first (ANSIBLE_INVENTORY_PLUGINS "
                           "or ansible.cfg's inventory_plugins)")
    plugin = inventory_loader.get(name)
    if plugin is None:
        raise GpuprovError(f"Ansible's {name} inventory plugin could not be loaded")
    return plugin


class _OnceEachInGroup(InventoryData):
    """Ansible merges a host listed twice in one group; in a hosts file that is a mistake to
    show (two lines, two machines meant), so it is refused. A host in two groups is Ansible's
    group membership and stays one host."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str | None]] = set()

    def add_host(self, host: str, group: str | None = None, port: int | None = None) -> str:
        if (str(host), group and str(group)) in self._seen:
            raise AnsibleError(f"host {host} is listed more than once in group {group}")
        self._seen.add((str(host), group and str(group)))
        return super().add_host(host, group, port)


class _HostsFileInventory(InventoryManager):
    """ansible-core's InventoryManager over one file, with Ansible's own yaml and ini plugins
    and nothing else: not the enabled list of ansible.cfg/ANSIBLE_INVENTORY_ENABLED (script,
    auto, constructed would run code or templates), no vars plugins, no group_vars folders."""

    def __init__(self, loader: DataLoader, source: str) -> None:
        self.failures: list[tuple[str, BaseException, int | None]] = []
        super().__init__(loader, sources=[source], parse=False)
        self.parse_sources()

    def _fetch_inventory_plugins(self) -> list[Any]:
        return [_ansible_plugin(name) for name in PLUGINS]

    def _plugins(self) -> list[tuple[str, Any]]:
        return list(zip(PLUGINS, self._fetch_inventory_plugins(), strict=True))

    def parse_sources(self, cache: bool = False) -> None:
        for source in self._sources:
            self.parse_source(source)

    def parse_source(self, source: str, cache: bool = False) -> bool:
        for name, plugin in self._plugins():
            try:
                wanted = bool(plugin.verify_file(source))
            except Exception:  # noqa: BLE001  (as Ansible: a plugin that cannot tell declines)
                wanted = False
            if not wanted:
                continue
            line = _track_ini_line(plugin) if name == "ini" else [None]
            self._inventory = _OnceEachInGroup()  # a failed plugin leaves nothing half read
            self._inventory.current_source = source
            try:
                plugin.parse(self._inventory, self._loader, source, cache=False)
            except Exception as exc:  # noqa: BLE001  (every plugin error is the file's)
                self.failures.append((name, exc, line[0]))
                continue
            self.failures.clear()
            self._inventory.current_source = None
            self._inventory.reconcile_inventory()
            return True
        return False


def _track_ini_line(plugin: Any) -> list[int | None]:
    """The line the ini plugin stopped at (its error carries none): read from the plugin's own
    position as it parses."""
    line: list[int | None] = [None]
    inner = getattr(plugin, "_parse", None)
    if inner is None:
        return line

    def parse(lines: list[str]) -> Any:
        try:
            return inner(lines)
        except Exception:
            line[0] = getattr(getattr(plugin, "_origin", None), "line_num", None)
            raise

    plugin._parse = parse
    return line
