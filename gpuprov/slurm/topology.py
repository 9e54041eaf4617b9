"""A topology Slurm can schedule by (docs/slurm.md, "Topology"): `topology.conf` for Slurm's
``topology/tree`` plugin, written from what gpuprov knows of where each node is.

- A node whose EC2 network topology is known (DescribeInstanceTopology's ``NetworkNodes``, top
  layer first: p4d, p4de, p5 and the other types AWS lists) hangs under the switch of its bottom
  network node; each network node is a switch, under the one above it.
- Otherwise a node is under the switch of its placement group (EC2's cluster placement group,
  the one gpuprov makes per zone for the types that use one), else under the switch of its zone
  (local and on-prem nodes: their provider's one zone).
- More than one top switch: one more, above them all, so a job may still span them (Slurm
  cannot place a job across switches that share no parent).

`sbatch --switches=1` then keeps a job's nodes under one leaf switch. Both Debian releases'
Slurm take ``topology/tree`` (22.05 on Debian 12, 24.11 on Debian 13); 24.11's
``topology/block`` is for NVLink domains of more than one node (GB200 NVL72), which no instance
type of gpuprov's catalog has.

Every name here becomes a word of a line of topology.conf: a switch is named by a network node
id (``nn-`` and letters and digits, as EC2 gives them), a placement group or a zone, each
checked and anything else dropped to the next rule, never written.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PLUGIN = "topology/tree"
_NETWORK_NODE = re.compile(r"nn-[0-9a-z]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True)
class Place:
    """Where one node is: its Slurm name, its EC2 network nodes (top first; () where unknown),
    its placement group ("" where none) and its zone."""

    node: str
    network_nodes: tuple[str, ...] = ()
    group: str = ""
    zone: str = ""


@dataclass
class Switch:
    name: str
    nodes: list[str] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)

    def line(self) -> str:
        parts = [f"SwitchName={self.name}"]
        if self.switches:
            parts.append(f"Switches={','.join(self.switches)}")
        if self.nodes:
            parts.append(f"Nodes={','.join(self.nodes)}")
        return " ".join(parts)


def switches(cluster: str, places: Iterable[Place]) -> list[Switch]:
    """The switches of ``places``' nodes, parents before children; [] where there is no node."""
    found: dict[str, Switch] = {}
    parent: dict[str, str] = {}

    def switch(name: str) -> Switch:
        return found.setdefault(name, Switch(name))

    for place in places:
        if not _NODE.fullmatch(place.node):
            continue  # gpuprov's own node names always match; anything else is never written
        chain = [n for n in place.network_nodes if _NETWORK_NODE.fullmatch(n)]
        if chain and len(chain) == len(place.network_nodes):
            for upper, lower in itertools.pairwise(chain):
                switch(upper)
                if parent.setdefault(lower, upper) == upper and lower not in switch(upper).switches:
                    switch(upper).switches.append(lower)
            switch(chain[-1]).nodes.append(place.node)
        elif place.group and _NAME.fullmatch(place.group):
            switch(f"pg-{place.group}").nodes.append(place.node)
        else:
            zone = place.zone if _NAME.fullmatch(place.zone or "") else "local"
            switch(f"zone-{zone}").nodes.append(place.node)
    tops = [name for name in found if name not in parent]
    if len(tops) > 1:
        root = f"{cluster}-top" if _NAME.fullmatch(f"{cluster}-top") else "top"
        found = {root: Switch(root, switches=sorted(tops)), **found}
    return _ordered(found)


def _ordered(found: dict[str, Switch]) -> list[Switch]:
    """Parents before children (as Slurm's docs write them), each list sorted."""
    for sw in found.values():
        sw.nodes.sort()
        sw.switches.sort()
    out: list[Switch] = []
    children = {c for sw in found.values() for c in sw.switches}
    queue = sorted(n for n in found if n not in children)
    while queue:
        name = queue.pop(0)
        out.append(found[name])
        queue.extend(found[name].switches)
    return out


def conf_lines(found: Sequence[Switch]) -> list[str]:
    """topology.conf's lines for ``found``."""
    return [sw.line() for sw in found]


def from_instance_topology(answer: dict, names: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """EC2's DescribeInstanceTopology ``answer`` as {node name: its network nodes}, for the
    instances ``names`` maps (instance id -> node name); instances of other clusters are left."""
    out: dict[str, tuple[str, ...]] = {}
    for instance in answer.get("Instances") or []:
        node = names.get(str(instance.get("InstanceId", "")))
        nodes = instance.get("NetworkNodes") or []
        if node and isinstance(nodes, list) and all(isinstance(n, str) for n in nodes):
            out[node] = tuple(nodes)
    return out
