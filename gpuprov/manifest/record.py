"""The controller's record of each node's manifest, and what `provision` makes of a node's check.

The record lives in the cluster's state (its recorded spec, key ``manifests``: {node: record});
a cluster or node without one has no manifest, and gets a full run. A record holds the node's
id (a node re-created under the same name has none), the digest of the manifest the node
holds, the digest of the desired inputs it was converged from (the plays, the run's variables
with the lock and the settings that reach the plays, the node's own inventory variables), the
plays it covers (``scope``: every play, or the tags of a `--tags` run) and how many items.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuprov import paths
from gpuprov.state import ClusterRecord, NodeRecord, Store, now

SPEC_KEY = "manifests"
SITE = "site"  # the scope of a run of every play
# Inventory variables that say how to reach a node, not what it should be (a local node's SSH
# port moves when its container restarts).
CONNECTION_VARS = frozenset({"ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
                             "ansible_ssh_common_args"})
_SKIPPED_PARTS = frozenset({"molecule", "__pycache__", ".pytest_cache"})


def scope_of(tags: Sequence[str] | None) -> str:
    return ",".join(sorted(set(tags))) if tags else SITE


@cache
def plays_digest() -> str:
    """sha256 over the playbooks and roles as they are (paths and bytes, sorted), scenarios and
    caches left out."""
    digest = hashlib.sha256()
    for base in (paths.playbooks_dir(), paths.roles_dir()):
        for path in sorted(p for p in base.rglob("*") if p.is_file()):
            rel = path.relative_to(base.parent)
            if _SKIPPED_PARTS & set(rel.parts) or path.suffix == ".pyc":
                continue
            digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def inputs_digest(extravars: Mapping[str, Any], hostvars: Mapping[str, Any], scope: str,
                  identity: Mapping[str, str]) -> str:
    """What one node was (or is to be) converged from, as one digest."""
    data = {"plays": plays_digest(), "vars": dict(extravars), "scope": scope, "identity": dict(identity),
            "host": {k: v for k, v in hostvars.items() if k not in CONNECTION_VARS}}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def records(cluster: ClusterRecord) -> dict[str, dict[str, Any]]:
    found = cluster.spec.get(SPEC_KEY)
    return {k: v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}


def write(store: Store, name: str, changes: Mapping[str, dict[str, Any] | None]) -> None:
    """Each node's record replaced (None: removed), the others kept."""
    if not changes:
        return
    cluster = store.get_cluster(name)
    if cluster is None:
        return
    kept = {k: v for k, v in records(cluster).items() if k not in changes}
    kept |= {k: v for k, v in changes.items() if v is not None}
    store.set_spec(name, {**cluster.spec, SPEC_KEY: kept})


def new_record(node: NodeRecord, answer: Mapping[str, Any], inputs: str, scope: str,
               identity: Mapping[str, str]) -> dict[str, Any]:
    return {"id": node.id, "digest": answer["digest"], "inputs": inputs, "scope": scope,
            "items": _count(answer.get("items")) or 0, **identity, "recorded": now()}


MAX_ITEMS = 1 << 31  # more items than any manifest holds: a node's figure past it is no count


def _count(value: Any) -> int | None:
    """A count a node answered, or None where it is none (text, a flag, a float, 1e999)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_ITEMS else None


@dataclass(frozen=True)
class Verdict:
    """What a node's check says `provision` does there: ``run`` or not, and why."""

    state: str
    items: int
    drift: tuple[str, ...]
    run: bool

    @property
    def line(self) -> str:
        if not self.run:
            return f"unchanged (manifest held, {self.items} items checked)"
        return f"full run ({self.state}" + (f": {'; '.join(self.drift)})" if self.drift else ")")


def verdict(node: NodeRecord, record: Mapping[str, Any] | None, answer: Mapping[str, Any] | None,
            error: str | None, inputs: str, scope: str) -> Verdict:
    """Held only when everything agrees: a record for this very node and scope, made from these
    inputs, of the manifest the node holds, and the node's check says held. Anything else, a
    doubt included, is a full run."""
    if record is None:
        return Verdict("no manifest recorded", 0, (), True)
    if record.get("id") != node.id:
        return Verdict("node re-created since its manifest", 0, (), True)
    if record.get("scope") != scope:
        return Verdict(f"manifest covers {record.get('scope')}, not {scope}", 0, (), True)
    if answer is None:
        return Verdict("manifest not checked", 0, (f"{error}",) if error else (), True)
    if not isinstance(answer, Mapping):
        return Verdict("manifest not checked", 0, ("the node's answer is not an object",), True)
    items, drift = _count(answer.get("items") or 0), answer.get("drift") or []
    if items is None or not isinstance(drift, list) or not all(isinstance(d, str) for d in drift):
        # A node's answer with fields not as its check writes them: not checked, a full run.
        return Verdict("manifest not checked", 0, ("the node's answer is not a manifest check's (items, drift)",),
                       True)
    drift = tuple(drift)
    state = str(answer.get("state"))
    if state != "held":
        return Verdict({"drifted": "drifted"}.get(state, f"manifest {state}"), items, drift, True)
    if answer.get("digest") != record.get("digest"):
        return Verdict("manifest replaced", items, ("the node's manifest is not the one recorded",), True)
    if record.get("inputs") != inputs:
        return Verdict("inputs changed", items, ("the plays, the lock, the settings or the node's "
                                                 "variables changed since its converge",), True)
    return Verdict("held", items, (), False)
