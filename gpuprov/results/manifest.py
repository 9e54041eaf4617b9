"""One node's manifest check in `provision`'s JSON (a part of gpuprov.results.shapes, on its own
so that module stays readable in a sitting)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ManifestCheck:
    """What `provision` made of one node's manifest (gpuprov.manifest.record.Verdict): its
    state, the action (unchanged or full run), the items checked and the drift in words."""

    state: str
    action: str
    items: int
    drift: list[str]
