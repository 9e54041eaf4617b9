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
  (``State=POWER_DOWN_FORCE``: a fresh instance boots for the next job), and so is one the spot
  watcher drained on an interruption notice once its jobs are requeued (its instance terminated
  before EC2 takes it); an instance of a dynamic
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

import ipaddress
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers.aws import api, power, power_boot
from gpuprov.slurm import elastic, power_http
from gpuprov.slurm.power_rules import orphans, reclaimed, unhealthy
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
_GROUP = re.compile(r"sg-[0-9a-f]{8,17}")
_PLACEMENT = re.compile(r"gpuprov-[a-z0-9][a-z0-9-]{0,39}-[a-z]{2}(-[a-z]+)+-\d[a-z]")


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
    efa = raw.get("efa_cards", 0)
    if isinstance(efa, bool) or not isinstance(efa, int) or not 0 <= efa <= 32:
        raise GpuprovError(f"{path}: efa_cards: from 0 to 32 (EFA interfaces per node)")
    if efa and not (isinstance(raw.get("security_group"), str) and _GROUP.fullmatch(raw["security_group"])):
        raise GpuprovError(f"{path}: security_group: {printable(str(raw.get('security_group')))[:80]!r} is not one "
                           "(EFA interfaces need the cluster's group)")
    groups = raw.get("placement_groups", [])
    if not isinstance(groups, list) or not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str)
            and _ZONE.fullmatch(p[0]) and _PLACEMENT.fullmatch(p[1]) for p in groups):
        raise GpuprovError(f"{path}: placement_groups: a list of [zone, gpuprov's placement group] pairs")
    for key in ("key_file", "rests"):
        if not isinstance(raw.get(key), str) or not raw[key].startswith("/"):
            raise GpuprovError(f"{path}: {key}: not an absolute path")
    _check_join(path, raw.get("join"))
    return raw


def _check_join(path: Path, join: Any) -> None:
    """The optional ``join`` (how a launched node joins): {controller_addr, munge_key,
    deadline_s}, each checked."""
    if join is None:
        return
    if not isinstance(join, dict) or set(join) - {"controller_addr", "munge_key", "deadline_s"}:
        raise GpuprovError(f"{path}: join: {{controller_addr, munge_key, deadline_s}}")
    try:
        ipaddress.ip_address(str(join.get("controller_addr")))
    except ValueError:
        raise GpuprovError(f"{path}: join: controller_addr: {printable(str(join.get('controller_addr')))[:60]!r} "
                           "is not an IP address") from None
    key = join.get("munge_key", elastic.MUNGE_KEY)
    if not isinstance(key, str) or not key.startswith("/"):
        raise GpuprovError(f"{path}: join: munge_key: not an absolute path")
    deadline = join.get("deadline_s", JOIN_S)
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 10 <= deadline <= 3600:
        raise GpuprovError(f"{path}: join: deadline_s: from 10 to 3600 seconds")


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
                               {zone: subnet for zone, subnet in config["subnets"]},
                               int(config.get("efa_cards") or 0), str(config.get("security_group") or ""),
                               {zone: group for zone, group in config.get("placement_groups") or []})
        self.rests = power.Rests.load(Path(config["rests"]))
        self.ec2, self.clock = ec2, clock
        self.lock = threading.Lock()  # one request at a time: the rests are read and written whole
        self.join: Join | None = Join.of(config)
        self.joining: list[threading.Thread] = []

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
            for node in reclaimed(sorted(running), nodes):
                why = _scontrol([node], "State=POWER_DOWN_FORCE")
                _say(f"spot {node}: {nodes[node].reason}, its jobs requeued or ended; "
                     + ("powered down (its instance terminated)" if not why else f"not powered down: {why}"))
            found, now = orphans(sorted(running), {n: r.state for n, r in nodes.items()}, suspects)
            for node in found:
                gone = power.suspend(self.ec2, self.cluster, [node])
                _say(f"orphan {node}: running while Slurm has it "
                     + (nodes[node].state if node in nodes else "unlisted") + f"; terminated {', '.join(gone)}")
            return now - set(found)

    def _resume(self, names: tuple[str, ...]) -> None:
        """Each node launched; one that cannot be (no zone with capacity, or EC2 refused or did
        not answer: a quota, a permission, no credentials yet) set DOWN with why, so Slurm
        requeues its job."""
        now = self.clock()
        for node in names:
            token = f"{node}-{int(now)}"
            try:
                bootstrap = self.join.bootstrap(node) if self.join else None
                data = self.join.user_data(node, bootstrap, token) if self.join and bootstrap else b""
                got: power.Started | power.Refused | str = power.resume(
                    self.ec2, self.plan, node, self.rests, now, token=token, user_data=data)
            except (api.ClientError, api.BotoCoreError) as exc:
                got = " ".join(f"{api.error_code(exc) or type(exc).__name__}: {api.error_message(exc)}".split())
            if isinstance(got, power.Started):
                _say(f"resume {node}: {got.instance} in {got.zone}")
                if self.join and bootstrap:
                    self._start_join(got, bootstrap)
                continue
            why = mark_down([node], f"resume failed: {got}")
            _say(f"resume {node}: {got}; " + ("set DOWN" if not why else f"not set DOWN: {why}"))


    def _start_join(self, got: power.Started, bootstrap: power_boot.Bootstrap) -> None:
        thread = threading.Thread(target=self._joined, args=(got, bootstrap), daemon=True)
        self.joining = [t for t in self.joining if t.is_alive()] + [thread]
        thread.start()

    def _joined(self, got: power.Started, bootstrap: power_boot.Bootstrap) -> None:
        """The node's hand-over once its instance runs; one that cannot join is set DOWN with why
        and terminated."""
        assert self.join is not None
        try:
            address = power.private_address(self.ec2, got.instance, self.join.deadline_s)
            power_boot.join(address, got.node, bootstrap, self.join.login, self.join.workdir,
                            self.join.archive(), self.join.deadline_s)
        except (GpuprovError, OSError, api.ClientError, api.BotoCoreError) as exc:
            why = mark_down([got.node], f"resume failed: {exc}")
            gone = power.suspend(self.ec2, self.cluster, [got.node])
            _say(f"join {got.node}: {exc}; " + ("set DOWN" if not why else f"not set DOWN: {why}")
                 + f"; terminated {', '.join(gone) or 'nothing'}")
            return
        _say(f"join {got.node}: {got.instance} at {address}: munge and slurmd started, the service's login locked")

    def wait_joins(self, timeout: float) -> bool:
        """Whether every join begun has ended within ``timeout`` seconds."""
        stop = time.monotonic() + timeout
        for thread in list(self.joining):
            thread.join(max(0.0, stop - time.monotonic()))
        return not any(t.is_alive() for t in self.joining)


@dataclass(frozen=True)
class Join:
    """How a launched node joins (gpuprov.providers.aws.power_boot): the controller's address as
    the nodes reach it, its munge key, the service's own login key and working directory (beside
    its rests: 0700 root), how long a node may take."""

    controller_addr: str
    munge_key: Path
    workdir: Path
    deadline_s: float

    @classmethod
    def of(cls, config: dict[str, Any]) -> Join | None:
        join = config.get("join")
        if not join:
            return None
        workdir = Path(config["rests"]).parent
        return cls(join["controller_addr"], Path(join.get("munge_key") or elastic.MUNGE_KEY), workdir,
                   float(join.get("deadline_s") or JOIN_S))

    @property
    def login(self) -> Path:
        return ssh.ensure_keypair(self.workdir / "login_ed25519", "gpuprov-power")

    def bootstrap(self, node: str) -> power_boot.Bootstrap:
        return power_boot.Bootstrap.new(self.workdir, node)

    def user_data(self, node: str, bootstrap: power_boot.Bootstrap, token: str) -> bytes:
        login = self.login.with_suffix(".pub").read_text()
        return power_boot.user_data(node, login, bootstrap, token)

    def archive(self) -> bytes:
        return power_boot.handover(self.controller_addr, self.munge_key.read_bytes())


# How long a launched node has to run and answer SSH before it is set DOWN and terminated (within
# slurm.conf's ResumeTimeout, which slurmctld's own fail program enforces anyway).
JOIN_S = 600.0


def serve(path: Path = CONFIG, stop: threading.Event | None = None, ec2: Any = None,
          on_listening: Any = None) -> int:
    """Serve the power program's requests on 127.0.0.1 until ``stop`` (or forever);
    ``on_listening(url)`` once it listens."""
    config = load(path)
    if ec2 is None:  # boto3 on the node (Debian's python3-boto3); credentials: the instance profile,
        # read at the first call (they may come a little after the service starts at boot)
        ec2 = api.connect(config["region"], need_credentials=False).ec2
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
            except (GpuprovError, api.ClientError, api.BotoCoreError) as exc:  # said; the next check tries again
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
