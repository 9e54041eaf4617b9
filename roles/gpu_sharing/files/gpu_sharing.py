#!/usr/bin/python3
"""gpuprov-gpu-sharing: bring a node's GPUs to the sharing asked (MIG layout, MPS, shards, none),
installed by gpuprov's gpu_sharing role (/usr/local/sbin/gpuprov-gpu-sharing) and run by it and,
at every boot, by gpuprov-gpu-sharing.service (MIG instances do not survive a reboot).

    gpuprov-gpu-sharing plan  --sharing mig:all-1g.10gb --instance 1g.10gb=7 [--json]
    gpuprov-gpu-sharing apply --sharing mig:all-1g.10gb --instance 1g.10gb=7 [--json]

``plan`` reads the GPUs (`nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending`,
`nvidia-smi mig -lgi`, `nvidia-smi mig -lci`) and prints the ordered steps that would bring them
to the sharing asked, changing nothing; ``apply`` runs them, then reads the GPUs again and fails
(exit 1) unless they now match. A node without nvidia-smi, or whose nvidia-smi finds no GPU,
plans nothing and says so. Every word of a command is the program's own or one checked against a
strict pattern below (a layout, a profile, a service name); nothing goes through a shell.

The plan, in order: nothing where every GPU matches; else stop the GPU's clients (slurmd first:
no job lands on a GPU being changed; the Kubernetes device plugin; dcgm-exporter and DCGM, which
hold the GPU through NVML; then, only where a GPU is reset, the driver's own clients: fabric
manager and the persistence daemon), destroy the compute and GPU instances that do not fit, set
the MIG mode where the pending one is not the one asked, reset the GPUs whose current mode is not
(a change already pending needs the reset alone), create the layout's GPU instances with their
compute instances, and start the clients again in the reverse order. After NVIDIA mig-parted's
hooks (deployments/systemd/hooks-default.yaml). ``apply`` stops only the clients that run, and
starts again only those it stopped.

gpuprov's own ``gpuprov.sharing.plan`` loads this file: the plan gpuprov's tests check is the one
the nodes run. Standard library only; Python 3.9 and newer.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

CLIENTS = ("slurmd", "nvidia-device-plugin", "gpuprov-dcgm-exporter", "dcgm-exporter", "nvidia-dcgm")
DRIVER_CLIENTS = ("nvidia-fabricmanager", "nvidia-persistenced")
# The words a value may be made of (gpuprov.sharing.choice and gpuprov.sharing.layouts hold the same).
# Each is matched whole (fullmatch).
SHARING = re.compile(r"none|mps|shard:([2-9]|[1-5][0-9]|6[0-4])|mig:[a-z0-9][a-z0-9.+-]{0,39}")
PROFILE = re.compile(r"[1-8]g\.[0-9]{1,3}gb(\+me)?")
SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9@._-]{0,63}")
MAX_INSTANCES = 7  # a GPU holds at most seven GPU instances (NVIDIA's MIG user guide)
QUERY = ("--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
# `mig -lgi`: "|   0  MIG 1g.10gb         19        9          2:1     |"; `mig -lci`:
# "|   0      7       MIG 1g.5gb           0         0          0:1     |".
_GI = re.compile(r"^\|\s+(\d+)\s+MIG\s+(\S+)\s+\d+\s+\d+\s+\d+:\d+\s+\|")
_CI = re.compile(r"^\|\s+(\d+)\s+\d+\s+MIG\s+\S+\s+\d+\s+\d+\s+\d+:\d+\s+\|")


@dataclass(frozen=True)
class Mode:
    current: str  # Enabled, Disabled, N/A (no MIG on this GPU)
    pending: str  # what it becomes at the next GPU reset


@dataclass(frozen=True)
class GpuState:
    """One GPU as nvidia-smi reports it."""

    index: int
    mode: Any  # a Mode (gpuprov passes its own gpuprov.sharing.smi.MigMode: current, pending)
    # {profile name: GPU instances} (mig -lgi), the names as the driver reports them.
    instances: Counter = field(default_factory=Counter)
    # GPU instances that hold a compute instance (mig -lci).
    with_compute: int = 0


@dataclass(frozen=True)
class Step:
    what: str  # stop, set-mode, reset, destroy, create, start
    gpu: int | None  # None: a service of the node
    command: tuple[str, ...]
    why: str


def plan(mode: str, spelled: str, layout: dict[str, int] | None, gpus: list[GpuState],
         renamed: dict[str, str] | None = None, clients: tuple[str, ...] = CLIENTS,
         driver_clients: tuple[str, ...] = DRIVER_CLIENTS) -> list[Step]:
    """The ordered steps; [] when every GPU already matches. ``mode``: mig, mps, shard or none;
    ``spelled``: the sharing as asked (mig:all-1g.10gb); ``layout``: a MIG layout's GPU instances
    per GPU; ``renamed``: {a driver's name: the layout's name} of a profile (A100-80GB's 3g.39gb
    is 3g.40gb)."""
    body: list[Step] = []
    reset = False
    for gpu in gpus:
        steps = _gpu_steps(mode, spelled, layout or {}, gpu, renamed or {})
        reset = reset or any(s.what == "reset" for s in steps)
        body += steps
    if not body:
        return []
    every = tuple(clients) + (tuple(driver_clients) if reset else ())
    stop = [Step("stop", None, ("systemctl", "stop", name), "a client of the GPUs") for name in every]
    start = [Step("start", None, ("systemctl", "start", name), "the GPUs are ready") for name in reversed(every)]
    return stop + body + start


def _gpu_steps(mode: str, spelled: str, layout: dict[str, int], gpu: GpuState, renamed: dict[str, str]) -> list[Step]:
    if gpu.mode.current == "N/A":  # a GPU without MIG: MPS and shards ask nothing of it here
        return []
    want = "Enabled" if mode == "mig" else "Disabled"
    i = str(gpu.index)
    have = Counter({renamed.get(name, name): n for name, n in gpu.instances.items()})
    fits = have == Counter(layout) and gpu.with_compute == sum(have.values())
    steps = []
    if gpu.mode.current == "Enabled" and have and (want == "Disabled" or not fits):
        steps += [Step("destroy", gpu.index, ("nvidia-smi", "mig", "-i", i, "-dci"), "compute instances"),
                  Step("destroy", gpu.index, ("nvidia-smi", "mig", "-i", i, "-dgi"), "GPU instances")]
    if gpu.mode.pending != want:
        steps.append(Step("set-mode", gpu.index, ("nvidia-smi", "-i", i, "-mig", "1" if want == "Enabled" else "0"),
                          f"MIG mode {gpu.mode.pending.lower()} -> {want.lower()}"))
    if gpu.mode.current != want:
        why = "the MIG mode change waits for it" if gpu.mode.pending == want else "to change the MIG mode"
        steps.append(Step("reset", gpu.index, ("nvidia-smi", "--gpu-reset", "-i", i), why))
    if want == "Enabled" and (gpu.mode.current != want or not fits):
        names = ",".join(name for name, n in layout.items() for _ in range(n))
        steps.append(Step("create", gpu.index, ("nvidia-smi", "mig", "-i", i, "-cgi", names, "-C"),
                          f"{spelled}: GPU instances and their compute instances"))
    return steps


# -- reading the node ----------------------------------------------------------------------------
class Unreadable(Exception):
    """nvidia-smi answered, but not as expected: the node's GPUs cannot be judged."""


def _smi(smi: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([smi, *args], capture_output=True, text=True, check=False, timeout=300,
                          stdin=subprocess.DEVNULL)


def read_gpus(smi: str) -> tuple[list[GpuState], str]:
    """Each GPU's MIG mode and instances; ([], why) where there is no GPU to read."""
    if shutil.which(smi) is None:
        return [], f"no {smi}: no NVIDIA driver on this node"
    out = _smi(smi, *QUERY)
    if out.returncode != 0:
        said = (out.stdout + out.stderr).strip()
        if "No devices were found" in said:
            return [], "nvidia-smi finds no GPU"
        raise Unreadable(f"nvidia-smi {' '.join(QUERY)}: exit {out.returncode}: {said[:300]}")
    modes = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            raise Unreadable(f"nvidia-smi {' '.join(QUERY)}: unexpected line {line!r}")
        modes[int(parts[0])] = Mode(_word(parts[1]), _word(parts[2]))
    if not modes:
        return [], "nvidia-smi finds no GPU"
    instances: dict[int, Counter] = {}
    computes: Counter = Counter()
    if any(m.current == "Enabled" for m in modes.values()):
        for line in _smi(smi, "mig", "-lgi").stdout.splitlines():
            found = _GI.match(line)
            if found:
                instances.setdefault(int(found[1]), Counter())[found[2]] += 1
        for line in _smi(smi, "mig", "-lci").stdout.splitlines():
            found = _CI.match(line)
            if found:
                computes[int(found[1])] += 1
    return [GpuState(i, m, instances.get(i, Counter()) if m.current == "Enabled" else Counter(),
                     computes[i] if m.current == "Enabled" else 0) for i, m in sorted(modes.items())], ""


def _word(value: str) -> str:
    """A MIG mode as -q spells it ([N/A] and [Not Supported] in the CSV: N/A)."""
    return value if value in ("Enabled", "Disabled") else "N/A"


# -- the request ---------------------------------------------------------------------------------
def _request(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuprov-gpu-sharing", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("plan", "apply"))
    parser.add_argument("--sharing", required=True, help="mig:LAYOUT, mps, shard:N or none")
    parser.add_argument("--instance", action="append", default=[], metavar="PROFILE=N",
                        help="a MIG layout's GPU instances per GPU (1g.10gb=7); once per profile, in order")
    parser.add_argument("--rename", action="append", default=[], metavar="DRIVERS=LAYOUTS",
                        help="a profile's name under some drivers and the layout's name of it (3g.39gb=3g.40gb)")
    parser.add_argument("--client", action="append", default=None, metavar="SERVICE",
                        help=f"a client of the GPUs, stopped in the order given (default: {', '.join(CLIENTS)})")
    parser.add_argument("--driver-client", action="append", default=None, metavar="SERVICE",
                        help=f"stopped too where a GPU is reset (default: {', '.join(DRIVER_CLIENTS)})")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if not SHARING.fullmatch(args.sharing):
        parser.error(f"--sharing {args.sharing!r}: expected mig:LAYOUT, mps, shard:N or none")
    args.layout = _pairs(parser, "--instance", args.instance,
                         lambda v: v.isascii() and v.isdigit() and 1 <= int(v) <= MAX_INSTANCES)
    args.renamed = _pairs(parser, "--rename", args.rename, PROFILE.fullmatch)
    if args.layout and not args.sharing.startswith("mig:"):
        parser.error("--instance gives a mig: layout's instances (and only a mig: layout's)")
    args.layout = {k: int(v) for k, v in args.layout.items()}
    if sum(args.layout.values()) > MAX_INSTANCES:
        parser.error(f"--instance: {sum(args.layout.values())} GPU instances; a GPU holds at most {MAX_INSTANCES}")
    for flag, names in (("--client", args.client), ("--driver-client", args.driver_client)):
        bad = [n for n in names or () if not SERVICE.fullmatch(n)]
        if bad:
            parser.error(f"{flag} {bad[0]!r}: not a service name")
    args.clients = tuple(CLIENTS if args.client is None else args.client)
    args.driver_clients = tuple(DRIVER_CLIENTS if args.driver_client is None else args.driver_client)
    if not re.fullmatch(r"/?[A-Za-z0-9_./-]+", args.nvidia_smi) or args.nvidia_smi.startswith("-"):
        parser.error(f"--nvidia-smi {args.nvidia_smi!r}: not a program path")
    return args


def _pairs(parser: argparse.ArgumentParser, flag: str, given: list[str], value_ok: Any) -> dict[str, str]:
    out = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep or not PROFILE.fullmatch(key) or not value_ok(value) or key in out:
            parser.error(f"{flag} {pair!r}: expected PROFILE=... once per profile (1g.10gb=7)")
        out[key] = value
    return out


# -- running it ----------------------------------------------------------------------------------
def _active(name: str) -> bool:
    return subprocess.run(["systemctl", "is-active", "--quiet", "--", f"{name}.service"], check=False,
                          stdin=subprocess.DEVNULL).returncode == 0


def _run(steps: list[Step], smi: str) -> list[dict[str, Any]]:
    """Each step run in order (a stop only of a client that runs, a start only of one stopped
    here); the first that fails ends the run, the clients stopped are started again."""
    done: list[dict[str, Any]] = []
    stopped: list[str] = []
    try:
        for step in steps:
            name = step.command[-1]
            if step.what == "stop" and not _active(name):
                done.append(_said(step, "not running"))
                continue
            if step.what == "start" and name not in stopped:
                done.append(_said(step, "not stopped here"))
                continue
            argv = [smi, *step.command[1:]] if step.command[0] == "nvidia-smi" else list(step.command)
            out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600,
                                 stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise Unreadable(f"{' '.join(step.command)}: exit {out.returncode}: "
                                 f"{(out.stdout + out.stderr).strip()[:300]}")
            if step.what == "stop":
                stopped.append(name)
            elif step.what == "start":
                stopped.remove(name)
            done.append(_said(step, "done"))
    finally:
        for name in reversed(stopped):  # a failed step: the clients it stopped are not left stopped
            subprocess.run(["systemctl", "start", "--", f"{name}.service"], check=False, stdin=subprocess.DEVNULL)
    return done


def _said(step: Step, result: str) -> dict[str, Any]:
    return {**asdict(step), "command": " ".join(step.command), "result": result}


def main(argv: list[str]) -> int:
    args = _request(argv)
    mode = args.sharing.split(":", 1)[0]
    try:
        gpus, none_why = read_gpus(args.nvidia_smi)
        if mode == "mig" and not args.layout and any(g.mode.current != "N/A" for g in gpus):
            raise Unreadable(f"{args.sharing}: the layout's GPU instances per GPU are not given (--instance)")
        steps = plan(mode, args.sharing, args.layout, gpus, args.renamed, args.clients, args.driver_clients)
        report: dict[str, Any] = {"sharing": args.sharing, "gpus": len(gpus), "no_gpu": none_why,
                                  "mig_gpus": sum(g.mode.current != "N/A" for g in gpus),
                                  "steps": [_said(s, "planned") for s in steps]}
        if args.action == "apply" and steps:
            report["steps"] = _run(steps, args.nvidia_smi)
            again = plan(mode, args.sharing, args.layout, read_gpus(args.nvidia_smi)[0], args.renamed)
            if again:
                raise Unreadable("the GPUs still do not match after the steps: "
                                 + "; ".join(" ".join(s.command) for s in again if s.gpu is not None))
    except (Unreadable, subprocess.TimeoutExpired, OSError) as exc:
        print(json.dumps({"error": str(exc)}) if args.json else f"gpuprov-gpu-sharing: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    elif none_why:
        print(f"gpuprov-gpu-sharing: {none_why}: nothing to do")
    else:
        for step in report["steps"]:
            print(f"{step['command']}  # {step['why']} ({step['result']})")
        if not steps:
            print(f"gpuprov-gpu-sharing: {len(gpus)} GPU(s) already as {args.sharing} asks: nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
