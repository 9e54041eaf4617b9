"""The power service of an elastic AWS cluster, on its controller node (issue 56): slurmctld's
power program (roles/slurm/files/gpuprov-slurm-power, unchanged) sends its signed requests to
it on the node itself, and it acts with the rights of the controller's instance profile
(docs/aws-iam-policy-power.json), so the cluster grows and shrinks while the operator's machine
is off.

- ``resume``: each node launched by gpuprov.providers.aws.power.resume; one that no zone can
  take is set DOWN with why (``gpuprov: resume failed: no capacity for TYPE: ZONE CODE; ...``),
  so Slurm requeues its job onto nodes that come up.
- ``suspend``: the nodes' instances terminated.
- ``fail`` (ResumeFailProgram: not registered within ResumeTimeout): the nodes set DOWN with
  that reason and their instances terminated.
- Every ``check_s`` seconds (60 unless the configuration says): a dynamic node drained by its
  own health (Reason ``gpuprov health: ...``) whose jobs have ended is powered down
  (``State=POWER_DOWN_FORCE``: a fresh instance boots for the next job); an instance of a dynamic
  node that Slurm has powered down or does not list, at two checks in a row, is an *orphan* and
  is terminated. The same rules as the local nodes' service (gpuprov.core.power_service), with
  this node's own sinfo; a check that gets no answer from sinfo judges nothing.

Its configuration is one file gpuprov writes (``CONFIG``: the cluster, its launch template,
image, type, zones' subnets, the power key's file, the port and where the zones' rests are
kept), every value checked before it is used. Each step is one line on stdout (the unit's
journal). It ships as a zipapp (gpuprov.slurm.power_aws_bundle), run as ``python3 -I
power-aws.pyz [CONFIG]`` until SIGTERM, or ``--check CONFIG``. Built and tested on this machine
against the emulated EC2 with the real power program, from the zipapp too
(tests/aws/test_power_aws.py); not yet installed on a controller by the slurm role.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers.aws import api, power
from gpuprov.slurm import elastic, power_http
from gpuprov.slurm.power_rules import orphans, unhealthy
from gpuprov.slurm.scheduler import NODE_NAME, SINFO, SlurmNode, parse_sinfo, reason_text

CONFIG = Path("/etc/gpuprov/power-aws.json")

_CHECKS = {
    "cluster": re.compile(r"[a-z0-9][a-z0-9-]{0,39}"),
    "region": re.compile(r"[a-z]{2}(-[a-z]+)+-\d"),
    "launch_template": re.compile(r"lt-[0-9a-f]{8,17}"),
    "image": re.compile(r"ami-[0-9a-f]{8,17}"),
    "instance_type": re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+"),
}
_ZONE = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
_SUBNET = re.compile(r"subnet-[0-9a-f]{8,17}")


def load(path: Path) -> dict[str, Any]:
    """The service's configuration, each value checked (GpuprovError naming the first that is not
    what gpuprov writes)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise GpuprovError(f"{path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(raw, dict):
        raise GpuprovError(f"{path}: not a JSON object")
    for key, pattern in _CHECKS.items():
        if not isinstance(raw.get(key), str) or not pattern.fullmatch(raw[key]):
            raise GpuprovError(f"{path}: {key}: {printable(str(raw.get(key)))[:80]!r} is not one")
    subnets = raw.get("subnets")
    if (not isinstance(subnets, list) or not subnets
            or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str)
                       and _ZONE.fullmatch(p[0]) and _SUBNET.fullmatch(p[1]) for p in subnets)):
        raise GpuprovError(f"{path}: subnets: a list of [zone, subnet] pairs, in the order zones are tried")
    for key in ("count", "port", "check_s"):
        if key == "check_s" and key not in raw:
            continue
        if not isinstance(raw.get(key), int) or isinstance(raw[key], bool) or not 0 <= raw[key] <= 65535:
            raise GpuprovError(f"{path}: {key}: not a number")
    if raw.get("check_s", CHECK_S) < 1:
        raise GpuprovError(f"{path}: check_s: at least 1")
    for key in ("key_file", "rests"):
        if not isinstance(raw.get(key), str) or not raw[key].startswith("/"):
            raise GpuprovError(f"{path}: {key}: not an absolute path")
    return raw


def _say(line: str) -> None:
    print(printable(line), flush=True)


CHECK_S = 60


def _scontrol(names: list[str], *settings: str) -> str:
    """``scontrol update NodeName=NAMES SETTINGS`` on this node: "" once done, else why not."""
    if not names or not all(NODE_NAME.fullmatch(n) for n in names):
        return f"not node names: {','.join(names)[:80]!r}"
    proc = subprocess.run(["scontrol", "update", f"NodeName={','.join(names)}", *settings],
                          capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode == 0:
        return ""
    return printable((proc.stderr or proc.stdout).strip())[:200] or f"exit {proc.returncode}"


def slurm_nodes() -> dict[str, SlurmNode] | None:
    """Each Slurm node's state and reason, as this node's sinfo says (None: no answer)."""
    try:
        proc = subprocess.run(list(SINFO), capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_sinfo(proc.stdout) if proc.returncode == 0 else None


def mark_down(names: list[str], reason: str) -> str:
    """Slurm nodes ``names`` DOWN with ``reason`` (this node's scontrol, as the service's user):
    "" once done, else why not."""
    return _scontrol(names, "State=DOWN", f"Reason=gpuprov: {reason_text(reason)}")


class Actions:
    """What each verified request does (module docstring), with ``ec2`` (a boto3 EC2 client)."""

    def __init__(self, config: dict[str, Any], ec2: Any, clock: Any = time.time) -> None:
        self.cluster = config["cluster"]
        self.plan = power.Plan(self.cluster, config["launch_template"], config["image"], config["instance_type"],
                               {zone: subnet for zone, subnet in config["subnets"]})
        self.rests = power.Rests.load(Path(config["rests"]))
        self.ec2, self.clock = ec2, clock
        self.lock = threading.Lock()  # one request at a time: the rests are read and written whole

    def __call__(self, action: str, names: tuple[str, ...]) -> None:
        with self.lock:
            if action == "resume":
                self._resume(names)
            elif action == "suspend":
                gone = power.suspend(self.ec2, self.cluster, list(names))
                _say(f"suspend {','.join(names)}: terminated {', '.join(gone) or 'nothing (no instance)'}")
            elif action == "fail":
                why = mark_down(list(names), "did not register within ResumeTimeout")
                gone = power.suspend(self.ec2, self.cluster, list(names))
                _say(f"{','.join(names)}: " + ("set DOWN" if not why else f"not set DOWN: {why}")
                     + f"; terminated {', '.join(gone) or 'nothing'}")
            else:
                raise GpuprovError(f"unknown action {action!r}")

    def check(self, suspects: set[str]) -> set[str]:
        """One check (module docstring): the orphans' suspects for the next check."""
        with self.lock:
            running = power.running(self.ec2, self.cluster)
            if not running:
                return set()
            nodes = slurm_nodes()
            if nodes is None:
                return suspects  # nothing is judged on no answer
            for node in unhealthy(sorted(running), nodes):
                why = _scontrol([node], "State=POWER_DOWN_FORCE")
                _say(f"unhealthy {node}: drained by its own health ({nodes[node].reason}); "
                     + ("powered down" if not why else f"not powered down: {why}"))
            found, now = orphans(sorted(running), {n: r.state for n, r in nodes.items()}, suspects)
            for node in found:
                gone = power.suspend(self.ec2, self.cluster, [node])
                _say(f"orphan {node}: running while Slurm has it "
                     + (nodes[node].state if node in nodes else "unlisted") + f"; terminated {', '.join(gone)}")
            return now - set(found)

    def _resume(self, names: tuple[str, ...]) -> None:
        now = self.clock()
        for node in names:
            got = power.resume(self.ec2, self.plan, node, self.rests, now, token=f"{node}-{int(now)}")
            if isinstance(got, power.Started):
                _say(f"resume {node}: {got.instance} in {got.zone}")
                continue
            why = mark_down([node], f"resume failed: {got}")
            _say(f"resume {node}: {got}; " + ("set DOWN" if not why else f"not set DOWN: {why}"))


def serve(path: Path = CONFIG, stop: threading.Event | None = None, ec2: Any = None,
          on_listening: Any = None) -> int:
    """Serve the power program's requests on 127.0.0.1 until ``stop`` (or forever);
    ``on_listening(url)`` once it listens."""
    config = load(path)
    if ec2 is None:  # boto3 on the node (Debian's python3-boto3); credentials: the instance profile
        ec2 = api.connect(config["region"]).ec2
    key = Path(config["key_file"]).read_bytes()
    actions = Actions(config, ec2)
    stop = stop or threading.Event()
    with power_http.PowerService("127.0.0.1", config["cluster"], config["count"], key, actions,
                                 port=config["port"], log=_say) as service:
        _say(f"power service of {config['cluster']} on EC2: listening on {service.url} for "
             f"{len(elastic.dynamic_names(config['cluster'], config['count']))} dynamic node(s)")
        if on_listening is not None:
            on_listening(service.url)
        suspects: set[str] = set()
        while not stop.wait(float(config.get("check_s") or CHECK_S)):
            try:
                suspects = actions.check(suspects)
            except (GpuprovError, api.ClientError) as exc:  # said; the next check tries again
                _say(f"checking the dynamic nodes: {exc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python3 -I power-aws.pyz [CONFIG]`` (the controller's unit): serve until SIGTERM;
    ``--check CONFIG``: check the configuration alone and say so (exit 1 with why)."""
    import signal
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    check = args[:1] == ["--check"]
    path = Path(args[1] if check else args[0]) if args[check:] else CONFIG
    try:
        if check:
            config = load(path)
            _say(f"{path}: the power service of {config['cluster']} ({config['region']}, {config['count']} "
                 "dynamic node(s)): configuration checked")
            return 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        return serve(path, stop)
    except (GpuprovError, OSError) as exc:
        print(f"gpuprov power service: {printable(str(exc))}", file=sys.stderr, flush=True)
        return 1
