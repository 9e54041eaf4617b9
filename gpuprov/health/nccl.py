"""What NCCL says: NVIDIA nccl-tests output (``all_reduce_perf`` and its siblings) and the
network NCCL chose (its ``NCCL_DEBUG=INFO`` lines), as plain data for the health checks.

nccl-tests prints one block per collective: a ``# Collective test starting: NAME`` line,
``#  Rank N Group G Pid P on HOST device D [BUS] MODEL`` lines, a table of one row per
message size (size, count, type, redop, root, then time/algbw/busbw/#wrong out of place
and in place), ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``.
Older releases have no root column and print ``error`` (a float) instead of ``#wrong``;
mpirun may prefix every line with ``[1,0]<stdout>:``, srun --label with ``0: ``. A one-rank run moves no data over a
bus: its busbw is 0 by definition (nccl-tests' PERFORMANCE.md), so a floor only means
something with two ranks or more.

NCCL picks its network once per communicator and says so (``Using network Socket``, or
``Initialized NET plugin Socket`` before 2.20-ish releases); on an EFA instance anything
but the OFI plugin (``Libfabric``/``AWS Libfabric``/``NET/OFI``) means inter-node traffic
falls back to TCP sockets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from gpuprov.health.floors import floor_for
from gpuprov.results.shapes import HealthCheck

# mpirun's "[1,0]<stdout>:" and srun --label's "0: " before every line.
_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\d+: )")
_RANK = re.compile(r"^#?\s*Rank\s+(\d+)\b.*?\bon\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s+(.+?)\s*$")
_START = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)")


@dataclass(frozen=True)
class Row:
    """One message size: out-of-place and in-place figures (GB/s, microseconds)."""

    size: int
    count: int
    dtype: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: float  # #wrong (a count) or, from older releases, the max error
    in_time_us: float
    in_algbw: float
    in_busbw: float
    in_wrong: float


@dataclass
class Run:
    """One collective's block of output."""

    collective: str
    version: str | None = None
    ranks: list[tuple[int, str, int, str, str]] = field(default_factory=list)  # rank, host, device, bus, model
    rows: list[Row] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None

    @property
    def hosts(self) -> list[str]:
        return sorted({host for _, host, _, _, _ in self.ranks})

    def at(self, size: int) -> Row | None:
        """The row of exactly ``size`` bytes, else of the largest size below it."""
        below = [r for r in self.rows if r.size <= size]
        return max(below, key=lambda r: r.size) if below else None

    @property
    def wrong(self) -> int:
        """Rows with wrong results (#wrong > 0), out of place or in place; the out-of-bounds
        count where nccl-tests printed one."""
        bad = sum(1 for r in self.rows if r.wrong > 0 or r.in_wrong > 0) if self._counts_wrong else 0
        return bad + (self.out_of_bounds or 0)

    @property
    def _counts_wrong(self) -> bool:
        # Older releases print the max error (2e-07), not a count: only the bounds check counts.
        return all(float(r.wrong).is_integer() and float(r.in_wrong).is_integer() for r in self.rows)


def _lines(text: str) -> list[str]:
    return [_PREFIX.sub("", line).rstrip() for line in text.splitlines()]


def _row(fields: list[str]) -> Row | None:
    """A table row: 12 fields (old: no root) or 13 (root after redop)."""
    if len(fields) == 13:
        fields = fields[:4] + fields[5:]
    if len(fields) != 12:
        return None
    try:
        size, count = int(fields[0]), int(fields[1])
        numbers = [float(x) for x in fields[4:]]
    except ValueError:
        return None
    return Row(size, count, fields[2], fields[3], *numbers)


def _finite(text: str) -> float | None:
    """A figure a node printed, or None where it is none (``1.2.3``, ``inf``, ``nan``)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_tests(text: str) -> list[Run]:
    """Every collective block in nccl-tests output, in order; a table without a starting
    line (older releases print none) opens a block of its own, named ``?``."""
    runs: list[Run] = []
    version = None
    current: Run | None = None
    for line in _lines(text):
        stripped = line.strip()
        if m := _VERSION.match(stripped):
            version = m.group(1)
        elif m := _START.match(stripped):
            current = Run(collective=m.group(1), version=version)
            runs.append(current)
        elif m := _RANK.match(stripped):
            if current is None:
                current = Run(collective="?", version=version)
                runs.append(current)
            current.ranks.append((int(m.group(1)), m.group(2), int(m.group(3)), m.group(4), m.group(5)))
        elif m := _OOB.match(stripped):
            if current is not None:
                current.out_of_bounds = int(m.group(1))
        elif m := _AVG.match(stripped):
            if current is not None:
                current.avg_busbw = _finite(m.group(1))  # "1.2.3": no figure, not checked
        elif stripped and not stripped.startswith("#") and (row := _row(stripped.split())) is not None:
            if current is None:
                current = Run(collective="?", version=version)
                runs.append(current)
            current.rows.append(row)
    return [r for r in runs if r.rows]


@dataclass(frozen=True)
class Network:
    """The network NCCL chose, and the lines that say so."""

    name: str | None  # "Socket", "IB", "Libfabric", "AWS Libfabric", ...
    plugin_missing: bool  # "NET/Plugin: Could not find: libnccl-net.so" (no OFI plugin found)
    evidence: tuple[str, ...]

    @property
    def ofi(self) -> bool:
        name = (self.name or "").lower()
        return "libfabric" in name or "ofi" in name

    @property
    def sockets(self) -> bool:
        return (self.name or "").lower() == "socket"


_NET = re.compile(r"NCCL INFO (?:Using network|Initialized NET plugin|Assigned NET plugin)\s+(.+?)(?:\s+to comm)?\s*$")


def network(text: str) -> Network:
    """From ``NCCL_DEBUG=INFO`` output: the network NCCL used (the last one it named)."""
    name, evidence, missing = None, [], False
    for line in _lines(text):
        if m := _NET.search(line):
            name = m.group(1).strip()
            evidence.append(line.strip())
        elif "NET/Plugin" in line and "Could not find" in line and "libnccl-net" in line:
            missing = True
            evidence.append(line.strip())
    return Network(name, missing, tuple(evidence))


def bandwidth_check(node: str, text: str, *, instance_type: str | None, nodes: int) -> HealthCheck:
    """The verdict on an all_reduce_perf run over ``nodes`` nodes of ``instance_type``: no
    wrong result, and the bus bandwidth at the floor's size at or above the floor
    (gpuprov.health.floors), out of place and in place."""
    def row(status: str, found: str, expected: str, action: str) -> HealthCheck:
        return HealthCheck(node=node, check="nccl_allreduce", status=status, found=found, expected=expected,
                           action=action)

    runs = [r for r in parse_tests(text) if r.collective in ("all_reduce_perf", "?")]
    if not runs:
        return row("fail", "no all_reduce_perf table in the output", "nccl-tests' table of sizes",
                   "read the raw output: nccl-tests did not run to its table (NCCL or MPI error)")
    run = runs[-1]
    if run.wrong:
        return row("fail", f"{run.wrong} wrong result(s) (#wrong or out-of-bounds values)", "no wrong result",
                   "drain the node: a GPU computes wrong sums; run `dcgmi diag -r 3` and RMA the GPU it names")
    floor = floor_for(instance_type, nodes)
    top = run.rows[-1]
    if floor is None:
        return row("pass", f"no wrong result; busbw {top.busbw} GB/s at {top.size} B",
                   f"no published floor for {instance_type or 'this host'} over {nodes} node(s): "
                   "wrong results only", "")
    at = run.at(floor.size)
    if at is None or at.size != floor.size:
        return row("fail", f"the run stopped at {top.size} B", f"a row at {floor.size} B, where the floor is read",
                   f"run all_reduce_perf up to -e {floor.size}")
    low = min(at.busbw, at.in_busbw)
    expected = (f">= {floor.busbw} GB/s at {floor.size} B over {nodes} node(s) ({floor.published} GB/s "
                f"published, less {floor.margin:.0%}: {floor.source})")
    found = f"busbw {at.busbw} GB/s out of place, {at.in_busbw} in place at {at.size} B"
    if low >= floor.busbw:
        return row("pass", found, expected, "")
    return row("fail", found, expected,
               "check that NCCL uses EFA (NCCL_DEBUG=INFO names NET/OFI, not Socket) and that every EFA "
               "interface is there (`gpuprov health NAME`: efa); then the GPUs and links (`dcgmi diag -r 3`)")
