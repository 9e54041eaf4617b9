"""Elastic Slurm: static and dynamic nodes, and the requests Slurm's power programs make.

A cluster of ``--count N --max-count M`` has N static nodes (always there) and M - N dynamic
ones, named ``NAME-dy-1`` .. ``NAME-dy-K`` (docs/slurm.md, "Elastic clusters"): slurm.conf
declares them ``State=CLOUD`` (the slurm role's ``slurm_dynamic_nodes``) and slurmctld runs the
cluster's power program with a hostlist when jobs need them (resume), when they have idled
``--idle-minutes`` (suspend), and when one did not register in time (fail).

The program (roles/slurm/files/gpuprov-slurm-power) runs on the controller as SlurmUser. It
parses nothing: it sends slurmctld's words as a request signed with the cluster's power key
(HMAC-SHA256, a key of its own, never the munge key or an SSH key), and whatever acts on it
(a provider's power service) checks it here: the signature, its age, the action, and that
every name the hostlist expands to is a dynamic node of this cluster within its count. A
hostlist is expanded by Slurm's own bracket syntax for this cluster's names only; anything
else is refused with what was wrong, never guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from gpuprov import defaults
from gpuprov.errors import BadInput, GpuprovError

# What a dynamic node's name says: the cluster's name, "-dy-", its number.
DYNAMIC_TAG = "dy"
ACTIONS = ("resume", "suspend", "fail")
DEFAULT_IDLE_MINUTES, MAX_IDLE_MINUTES = defaults.DEFAULT_IDLE_MINUTES, defaults.MAX_IDLE_MINUTES
# A request older (or newer: clocks apart) than this is refused: one cannot be replayed later.
MAX_AGE_S = 120
KEY_BYTES = 32
# The most nodes one hostlist may name (a request cannot make the service expand without bound).
MAX_NODES = 4096
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


@dataclass(frozen=True)
class Elastic:
    """``--max-count`` and ``--idle-minutes`` of a cluster with ``count`` static nodes."""

    count: int
    max_count: int
    idle_minutes: int = DEFAULT_IDLE_MINUTES

    @property
    def dynamic(self) -> int:
        return self.max_count - self.count

    def checked(self, scheduler: str, provider_can_power: bool, provider: str,
                why_not: str = "gpuprov cannot start or stop this provider's hosts") -> Elastic:
        """BadInput, one line, for a request that cannot be: nothing is created. ``why_not``:
        why the provider cannot power nodes, where it cannot."""
        if scheduler != "slurm":
            raise BadInput(f"--max-count {self.max_count}: dynamic nodes are Slurm's (--scheduler slurm); "
                           f"this cluster's scheduler is {scheduler}")
        if not provider_can_power:
            raise BadInput(f"--max-count with --provider {provider}: {why_not}; give --count alone")
        if self.max_count < self.count:
            raise BadInput(f"--max-count {self.max_count} is smaller than --count {self.count}: it counts "
                           "the static nodes too")
        if not 1 <= self.idle_minutes <= MAX_IDLE_MINUTES:
            raise BadInput(f"--idle-minutes {self.idle_minutes}: from 1 to {MAX_IDLE_MINUTES} (a week)")
        return self


def dynamic_name(cluster: str, index: int) -> str:
    return f"{cluster}-{DYNAMIC_TAG}-{index}"


def dynamic_names(cluster: str, count: int) -> list[str]:
    return [dynamic_name(cluster, i) for i in range(1, count + 1)]


def expand(hostlist: str, cluster: str, count: int) -> list[str]:
    """The names a Slurm hostlist of this cluster's dynamic nodes stands for, in order:
    ``train-dy-3``, ``train-dy-[1-2,5]``, ``train-dy-[01-02]``, several joined by ','. A name
    that is not one of the cluster's ``count`` dynamic nodes refuses the whole list."""
    if not isinstance(hostlist, str) or not hostlist or len(hostlist) > 8192:
        raise GpuprovError(f"hostlist {str(hostlist)[:80]!r}: expected Slurm's node list")
    allowed = set(dynamic_names(cluster, count))
    prefix = f"{cluster}-{DYNAMIC_TAG}-"
    names: list[str] = []
    for part in _parts(hostlist):
        if part.startswith(prefix + "[") and part.endswith("]"):
            numbers = _numbers(part[len(prefix) + 1:-1], part)
        elif part.startswith(prefix) and part[len(prefix):].isdigit():
            numbers = [int(part[len(prefix):])]
        else:
            raise GpuprovError(f"hostlist {hostlist!r}: {part!r} is not a dynamic node of {cluster}")
        names += [f"{prefix}{n}" for n in numbers]
        if len(names) > MAX_NODES:
            raise GpuprovError(f"hostlist {hostlist[:80]!r}: more than {MAX_NODES} nodes")
    foreign = [n for n in names if n not in allowed]
    if foreign:
        raise GpuprovError(f"hostlist {hostlist!r}: {', '.join(foreign[:5])} not among {cluster}'s "
                           f"{count} dynamic node(s)")
    return list(dict.fromkeys(names))


_HOST_RANGE = re.compile(r"([^\[\],]*)\[([0-9,\-]+)\]([^\[\],]*)")


def hostnames(hostlist: str) -> list[str]:
    """Every name a Slurm hostlist stands for, in order, of any node (what `sacct` and `squeue`
    print): ``a``, ``a,b``, ``node-[1-3,7]``, ``gpu[01-02]x`` (zero padding kept); ``None
    assigned`` (a pending job's) and an empty list stand for none."""
    if hostlist in ("", "None assigned"):
        return []
    names: list[str] = []
    for part in _parts(hostlist):
        found = _HOST_RANGE.fullmatch(part)
        if found is None:
            if not part or "[" in part or "]" in part:
                raise GpuprovError(f"hostlist {hostlist[:80]!r}: {part!r} is not a name or a range")
            names.append(part)
        else:
            head, ranges, tail = found.groups()
            for item in ranges.split(","):
                low = item.split("-", 1)[0]
                width = len(low) if low.startswith("0") and len(low) > 1 else 0
                numbers = _numbers(item, part)
                names += [f"{head}{n:0{width}d}{tail}" for n in numbers]
        if len(names) > MAX_NODES:
            raise GpuprovError(f"hostlist {hostlist[:80]!r}: more than {MAX_NODES} nodes")
    return names


def _parts(hostlist: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in hostlist:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise GpuprovError(f"hostlist {hostlist!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth:
        raise GpuprovError(f"hostlist {hostlist!r}: unbalanced brackets")
    return [*parts, current]


def _numbers(ranges: str, part: str) -> list[int]:
    out: list[int] = []
    for item in ranges.split(","):
        found = _RANGE.fullmatch(item)
        if not found:
            raise GpuprovError(f"hostlist part {part!r}: {item!r} is not a number or a range")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if high < low or high - low >= MAX_NODES:
            raise GpuprovError(f"hostlist part {part!r}: range {item!r}")
        out += range(low, high + 1)
    return out


# -- what a dynamic node is given -----------------------------------------------------------------
SLURMD_DEFAULTS = "/etc/default/slurmd"
SLURMD_DROP_IN = "/etc/systemd/system/slurmd.service.d/gpuprov-dynamic.conf"
MUNGE_KEY = "/etc/munge/munge.key"


# The node's own quick health (the slurm role installs gpuprov's zipapp and what the node is held
# to), run before slurmd: a node that fails it never registers, so it is never given a job.
NODE_CHECK = ("/usr/bin/python3", "-I", "-S", "/usr/local/lib/gpuprov/node-health.pyz", "--expect",
              "/etc/slurm/gpuprov-health-expect.json")


def node_files(controller_addr: str, *, container: bool) -> list[tuple[str, bytes, int]]:
    """The files that make a node booted from the cluster's image a dynamic node of it, beside
    the munge key (the service copies that from the cluster's file, 0400 munge): slurmd fetches
    its configuration from slurmctld (`--conf-server`, enable_configless), Debian's unit, which
    skips slurmd where /etc/slurm/slurm.conf is missing, is told not to, and slurmd starts only
    once the node passes its own quick health (NODE_CHECK). On a container slurmd reports a
    boot when it starts (`slurmd -b`, Slurm's own flag): a container reports the host's
    uptime, and slurmctld waits for a node to boot after its resume request (docs/slurm.md, the
    recording resume-by-hand.txt). ``controller_addr`` must be an IP address: it ends up in a
    file of the node's, so nothing else is written there."""
    try:
        addr = ipaddress.ip_address(controller_addr)
    except ValueError:
        raise GpuprovError(f"controller address {controller_addr[:60]!r}: expected an IP address") from None
    server = f"[{addr}]" if addr.version == 6 else str(addr)
    unit = ["# Written by gpuprov's power service: a dynamic node, configured by slurmctld.", "[Unit]",
            "ConditionPathExists=", "", "[Service]", f"ExecStartPre={' '.join(NODE_CHECK)}"]
    options = f"--conf-server {server}" + (" -b" if container else "")
    return [(SLURMD_DEFAULTS, f"SLURMD_OPTIONS={options}\n".encode(), 0o644),
            (SLURMD_DROP_IN, ("\n".join(unit) + "\n").encode(), 0o644)]


# -- the power program's requests --------------------------------------------------------------
def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def sign(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PowerRequest:
    action: str
    nodes: tuple[str, ...]
    hostlist: str
    at: float


def request_body(action: str, hostlist: str, at: float | None = None) -> bytes:
    """What the power program sends (its own copy: roles/slurm/files/gpuprov-slurm-power)."""
    return json.dumps({"action": action, "hostlist": hostlist, "at": time.time() if at is None else at},
                      sort_keys=True).encode()


class Seen:
    """The signatures of the requests taken in the last MAX_AGE_S: one is taken once."""

    def __init__(self) -> None:
        self.taken: dict[str, float] = {}

    def take(self, signature: str, at: float, now: float) -> None:
        self.taken = {s: t for s, t in self.taken.items() if now - t <= MAX_AGE_S}
        if signature in self.taken:
            raise GpuprovError("power request: already taken (a replay)")
        self.taken[signature] = at


def verify(key: bytes, body: bytes, signature: str, cluster: str, count: int,
           now: float | None = None, seen: Seen | None = None) -> PowerRequest:
    """The request, once its signature, age, action and every node hold and (with ``seen``) it
    was not taken before; GpuprovError naming what does not (nothing is done for it)."""
    if not isinstance(signature, str) or not hmac.compare_digest(sign(key, body), signature):
        raise GpuprovError("power request: bad signature (not signed with this cluster's power key)")
    try:
        raw: Any = json.loads(body)
    except ValueError:
        raise GpuprovError("power request: not JSON") from None
    if not isinstance(raw, dict) or set(raw) != {"action", "hostlist", "at"}:
        raise GpuprovError("power request: expected exactly action, hostlist and at")
    action, hostlist, at = raw["action"], raw["hostlist"], raw["at"]
    if action not in ACTIONS:
        raise GpuprovError(f"power request: action {str(action)[:40]!r} is not one of {', '.join(ACTIONS)}")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise GpuprovError("power request: at is not a time")
    now = time.time() if now is None else now
    if abs(now - at) > MAX_AGE_S:
        raise GpuprovError(f"power request: made {now - at:.0f} s ago, more than {MAX_AGE_S} s either way (a "
                           "replay, or the controller's clock is off)")
    nodes = tuple(expand(hostlist, cluster, count))
    if seen is not None:
        seen.take(signature, float(at), now)
    return PowerRequest(action=action, nodes=nodes, hostlist=hostlist, at=float(at))
