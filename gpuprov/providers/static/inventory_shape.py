"""A YAML hosts file in the shape Ansible's yaml inventory plugin reads whole.

That plugin skips, with a warning that names its own tagged classes (``Skipping key (gpu1) in
group (hosts) as it is not a mapping, it is a ..._AnsibleTaggedStr``), a group key other than
hosts, children and vars, and a group that is not a mapping: the hosts there are left out of
the cluster. gpuprov refuses such a file instead, one line naming the file, the group or host
and the key, before anything runs; a top-level ``hosts:`` that is no list is gpuprov's own
format gone wrong and is said so. (gpuprov.providers.static.hosts_file reads the file.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuprov.errors import BadInput

# The keys of a group in Ansible's YAML inventory; its yaml plugin skips any other, warning.
GROUP_KEYS = ("hosts", "children", "vars")


def check(data: Mapping[str, Any], where: str, own_keys: frozenset[str] | set[str]) -> None:
    """A YAML inventory in the shape Ansible's yaml plugin reads whole: what it would skip with
    a warning (and leave out of the cluster) is refused, one line naming the file, the group or
    host and the key. A top-level ``hosts:`` that is no list is gpuprov's own format gone wrong."""
    for group in sorted(data, key=lambda g: g != "hosts"):  # the hosts it names first
        if group == "hosts" or group in own_keys:
            _own_format(group, data[group], where)
        _group_shape(group, data[group], where)


def _own_format(key: str, body: Any, where: str) -> None:
    if key != "hosts":
        if not isinstance(body, Mapping):
            raise BadInput(f"{where}: {key}: a setting of gpuprov's format, whose hosts: is a list of hosts "
                           "('- name: HOST' and its fields); an Ansible inventory has groups at the top")
        return
    extra = [k for k in body if k not in GROUP_KEYS] if isinstance(body, Mapping) else []
    if isinstance(body, Mapping) and not extra:
        return  # an Ansible group named hosts
    first = extra[0] if extra else None
    host = body["name"] if first == "name" and isinstance(body.get("name"), str) else first or "HOST"
    raise BadInput(f"{where}: " + (f"host {host}: " if first else "") + f"hosts: is {_kind(body)}, not a list: "
                   f"gpuprov's format lists one '- name: {host}' item per host, and an Ansible inventory puts "
                   f"a host under a group (all: hosts: {host}: ...)")


def _group_shape(group: str, body: Any, where: str) -> None:
    if body is None:
        return
    if not isinstance(body, Mapping):
        raise BadInput(f"{where}: group {group}: expected a mapping of hosts:, children: and vars:, "
                       f"not {_kind(body)}")
    for key, value in body.items():
        if key not in GROUP_KEYS:
            raise BadInput(f"{where}: group {group}: unknown key {key} (a group holds hosts:, children: "
                           "and vars:; a host goes under hosts:)")
        if value is None or isinstance(value, str):  # Ansible reads 'hosts: gpu1' as one host
            continue
        if not isinstance(value, Mapping):
            raise BadInput(f"{where}: group {group}: {key}: expected a mapping, not {_kind(value)}")
        if key == "children":
            for child, child_body in value.items():
                _group_shape(child, child_body, where)
        elif key == "hosts":
            for host, variables in value.items():
                if variables is not None and not isinstance(variables, Mapping):
                    raise BadInput(f"{where}: host {host}: expected a mapping of its variables "
                                   f"(ansible_host: ..., ansible_user: ...), not {_kind(variables)}")


def _kind(value: Any) -> str:
    """A YAML value's kind as its writer knows it (never Ansible's tagged class names)."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r}" if isinstance(value, str | int | float | bool) else "empty"
