"""Slurm's topology.conf for its ``topology/tree`` plugin (slurm.conf's ``TopologyPlugin``, written
by ``slurm_conf`` where the description gives a topology), from the description's ``topology``::

    "topology": [{"name": "c-top", "switches": ["pg-a", "pg-b"]},
                 {"name": "pg-a", "nodes": ["c-node-1", "c-node-2"]},
                 {"name": "pg-b", "nodes": ["c-node-3"]}]

gpuprov builds it from where its nodes are (gpuprov.slurm.topology: EC2's network nodes, else
placement groups, else zones); a user of the role may give their own. Checked whole before a
line is written: every name a word of letters, digits, ``.``, ``_`` and ``-``; every node one of
the description's nodes, under exactly one switch, and every node of the description under
one; every switch named once, defined, under at most one parent, and no switch its own
ancestor. Anything else is refused with ``SlurmTopologyError`` naming it. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class SlurmTopologyError(ValueError):
    """A topology topology.conf cannot express safely."""


def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and _NAME.fullmatch(v) for v in value):
        raise SlurmTopologyError(f"{what}: expected a list of names (letters, digits, '.', '_', '-'), got {value!r}")
    return list(value)


def switches(description: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The description's topology, checked: [{name, nodes, switches}] in its order."""
    raw = description.get("topology") or []
    if not isinstance(raw, list):
        raise SlurmTopologyError(f"topology: expected a list of switches, got {raw!r}")
    every = [n.get("name") for n in [*(description.get("nodes") or []), *(description.get("dynamic_nodes") or [])]
             if isinstance(n, Mapping)]
    out: list[dict[str, Any]] = []
    for entry in raw:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) \
                or not _NAME.fullmatch(entry["name"]):
            raise SlurmTopologyError(f"topology: a switch needs a name of letters, digits, '.', '_', '-': {entry!r}")
        sw = {"name": entry["name"], "nodes": _names(entry.get("nodes"), f"switch {entry['name']}: nodes"),
              "switches": _names(entry.get("switches"), f"switch {entry['name']}: switches")}
        if not sw["nodes"] and not sw["switches"]:
            raise SlurmTopologyError(f"switch {sw['name']}: neither nodes nor switches under it")
        out.append(sw)
    names = [sw["name"] for sw in out]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SlurmTopologyError(f"topology: a switch named twice ({', '.join(twice)})")
    placed = [n for sw in out for n in sw["nodes"]]
    if out:
        for node in placed:
            if node not in every:
                raise SlurmTopologyError(f"topology: {node} is no node of the cluster")
            if placed.count(node) > 1:
                raise SlurmTopologyError(f"topology: {node} is under more than one switch")
        missing = [n for n in every if n not in placed]
        if missing:
            raise SlurmTopologyError(f"topology: {', '.join(missing)} under no switch "
                                     "(Slurm could not place a job there)")
    parent: dict[str, str] = {}
    for sw in out:
        for child in sw["switches"]:
            if child not in names:
                raise SlurmTopologyError(f"switch {sw['name']}: {child} is no switch of the topology")
            if parent.setdefault(child, sw["name"]) != sw["name"]:
                raise SlurmTopologyError(f"switch {child} is under more than one switch")
    for name in names:
        seen, at = {name}, name
        while at in parent:
            at = parent[at]
            if at in seen:
                raise SlurmTopologyError(f"switch {name} is under itself")
            seen.add(at)
    return out


def topology_conf(description: Mapping[str, Any]) -> str:
    """topology.conf: one line a switch."""
    lines = ["# topology.conf written by the slurm role (gpuprov): Slurm's topology/tree switches."]
    for sw in switches(description):
        line = f"SwitchName={sw['name']}"
        if sw["switches"]:
            line += f" Switches={','.join(sw['switches'])}"
        if sw["nodes"]:
            line += f" Nodes={','.join(sw['nodes'])}"
        lines.append(line)
    return "\n".join(lines) + "\n"


class FilterModule:
    def filters(self):
        return {"slurm_topology_conf": topology_conf}
