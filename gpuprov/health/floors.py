"""NCCL all_reduce bus-bandwidth floors: what healthy nodes of a type reach, less a margin.

A floor is read at one message size (the size the check runs to), for a number of nodes.
Each comes from a published result on that type, named with its source; the floor is that
result less 20 %. Why 20 %: the published runs used one NCCL and aws-ofi-nccl release
(NCCL 2.20.3, aws-ofi-nccl 1.8.1-aws, EFA installer 1.31.0) and one placement; other releases
and placements move the figure by some percent, not by a fifth. What a floor must catch is
far below it: a node whose NCCL falls back to TCP sockets (what NCCL says when it finds no
OFI plugin: "Using network Socket", as in the recorded H100 run), or that runs with EFA
interfaces missing, moves its inter-node traffic over a fraction of the links the published
figure used.

busbw, not algbw: nccl-tests' PERFORMANCE.md defines busbw so that it reflects how well the
hardware is used independently of the number of ranks, which is why a two-node floor is also
applied to larger runs of the same type (more nodes add ring steps, not bandwidth per link).

Only types with a published result have a floor; the others are checked for wrong results
only, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30

_AWSOME = ("aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md "
           "(commit 27b7d49e944e55839324a22fe5ed9f77170d7999), all_reduce_perf on 2 x {what} over EFA")


@dataclass(frozen=True)
class Floor:
    types: tuple[str, ...]
    min_nodes: int  # the floor holds from this many nodes up (1: inside one node)
    size: int  # message size (bytes) the floor is read at
    busbw: float  # GB/s the row of that size must reach (out of place and in place)
    published: float  # GB/s in the source at that size
    source: str

    @property
    def margin(self) -> float:
        return round(1 - self.busbw / self.published, 2)


FLOORS: tuple[Floor, ...] = (
    # p4d has the same A100 NVSwitch board and the same 4 x 100 Gb/s EFA as p4de (GPU memory
    # differs, 40 GB against 80 GB, which all_reduce at 2 GiB does not feel).
    Floor(("p4d.24xlarge", "p4de.24xlarge"), 2, 2 * GIB, 62.0, 78.33, _AWSOME.format(what="p4de.24xlarge")),
    Floor(("p5.48xlarge",), 2, 2 * GIB, 355.0, 443.72, _AWSOME.format(what="p5.48xlarge")),
)


def floor_for(instance_type: str | None, nodes: int) -> Floor | None:
    """The floor of ``instance_type`` for a run over ``nodes`` nodes (None: none published)."""
    found = [f for f in FLOORS if instance_type in f.types and nodes >= f.min_nodes]
    return max(found, key=lambda f: f.min_nodes) if found else None
