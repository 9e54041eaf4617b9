"""`--gpu-sharing` as typed: ``mig:LAYOUT``, ``mps``, ``shard:N`` or ``none``, read into a
``Sharing`` (BadInput, one line, for anything else). A leaf: the layout name is checked for its
form here and against the GPU model's layouts by gpuprov.sharing.layouts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprov.defaults import MAX_GPU_SHARDS
from gpuprov.errors import BadInput

MODES = ("mig", "mps", "shard", "none")
# A layout's name as NVIDIA's mig-parted writes them: all-1g.10gb, all-1g.10gb.me, all-balanced.
_LAYOUT = re.compile(r"^[a-z0-9][a-z0-9.+-]{0,39}$")
FORMS = f"mig:LAYOUT, mps, shard:N (N from 2 to {MAX_GPU_SHARDS}) or none"


@dataclass(frozen=True)
class Sharing:
    mode: str  # one of MODES
    # mig: the layout's name (a key of the model's data file); else "".
    layout: str = ""
    # shard: Slurm shards per GPU (gres/shard); else 0.
    shards: int = 0

    def spelled(self) -> str:
        """As the lock records it ("" for none: a lock without sharing keeps its hash)."""
        if self.mode == "mig":
            return f"mig:{self.layout}"
        if self.mode == "shard":
            return f"shard:{self.shards}"
        return "" if self.mode == "none" else self.mode


NONE = Sharing("none")


def parse(value: str | None) -> Sharing:
    """The sharing a value asks for (None or "": none)."""
    text = (value or "").strip()
    if not text or text == "none":
        return NONE
    parts = [p.strip() for p in text.split(",")]
    modes = {p.split(":", 1)[0] for p in parts}
    if len(parts) > 1:
        if {"mig", "mps"} <= modes:
            raise BadInput(f"--gpu-sharing {value}: MIG and MPS together are not offered: a MIG instance "
                           "is already an isolated GPU; choose mig:LAYOUT or mps")
        raise BadInput(f"--gpu-sharing {value}: one mode at a time: {FORMS}")
    mode, sep, arg = text.partition(":")
    if mode == "mps" and not sep:
        return Sharing("mps")
    if mode == "mig" and sep:
        if not _LAYOUT.match(arg):
            raise BadInput(f"--gpu-sharing {value}: '{arg}' is no MIG layout name (all-1g.10gb, all-balanced, ...)")
        return Sharing("mig", layout=arg)
    if mode == "shard" and sep:
        if not arg.isdigit() or not 2 <= int(arg) <= MAX_GPU_SHARDS:
            raise BadInput(f"--gpu-sharing {value}: shards per GPU from 2 to {MAX_GPU_SHARDS} "
                           "(shard:1 is the whole GPU: give none)")
        return Sharing("shard", shards=int(arg))
    raise BadInput(f"--gpu-sharing {value}: expected {FORMS}")


def of_lock(recorded: str | None) -> Sharing:
    """The sharing a lock records (a lock stored before sharing records none)."""
    return parse(recorded or None)
