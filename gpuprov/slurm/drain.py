"""`gpuprov patch` on a Slurm cluster: each batch's nodes drained through Slurm before their
patch, and resumed after it once healthy.

- **Drain**: ``scontrol update NodeName=N State=DRAIN Reason="gpuprov patch: ..."`` on the
  controller; no new job lands on the node. The roll then waits for the jobs running there
  (``squeue``: running, completing or configuring) for the grace time (``--grace``, default
  1800 s); with ``--force`` it does not wait, and a job still there may fail when its node is
  patched. Jobs still running when the grace time is over: the node is not patched and fails
  (the roll stops), and stays drained, so its jobs end and nothing new starts there.
- **A node someone else drained** (any Reason that is not gpuprov's own) keeps its state and
  Reason: it is waited for and patched, and never resumed by gpuprov.
- **A node its own health drained** (the slurm role's health program, Reason ``gpuprov
  health: ...``): the roll's Reason takes over, the health's kept in it, so that the health
  program, which resumes only what it drained, cannot resume the node mid-patch; the roll's
  end decides (resumed once healthy, else left drained with why).
- **Resume**: a node that passed its probes and health gate, whose Reason is still the roll's,
  is resumed (``State=RESUME``).
- **Failed**: a node that failed its play, its probes or its health gate stays drained, its
  Reason ``gpuprov patch failed: <what failed>``; the next roll that patches it resumes it.
- **Held** (a roll that moves the GPU sharing): a patched node stays drained, its Reason
  ``gpuprov patch: held for Slurm's GPU sharing: ...``, until slurm.conf and gres.conf on every
  node have the new sharing (a file all nodes hold the same, which no batch can move alone);
  then every node held so, by this roll or an earlier one that stopped, is resumed.

Every command is fixed words run on the controller over its pinned SSH connection (``sudo -n``:
gpuprov's login user on every node has passwordless sudo); the only other words are the node's
Slurm name (its hostname, as slurm.conf lists it: read from the node, checked against Slurm's
name rules) and the Reason, one argument, quoted for the node's shell, its text made of
gpuprov's words and the failure's one-line summary.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles
from gpuprov.state import NodeRecord

GRACE_S = 1800  # the default time a drained node's running jobs get to end
POLL_S = 3.0
OWN = "gpuprov patch"  # every Reason a roll writes starts with it
FAILED = f"{OWN} failed"
HELD = f"{OWN}: held for Slurm's GPU sharing"
# The Reason the slurm role's health program (roles/slurm/files/gpuprov-slurm-health) drains with.
HEALTH = "gpuprov health: "
# The Reason the spot watcher drains with on an interruption notice
# (roles/spot_interruption/templates/gpuprov-spot-watch.py.j2: "spot interruption at TIME").
SPOT = "spot interruption at "
REASON_MAX = 240
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # whole-string: fullmatch
BUSY_STATES = "RUNNING,COMPLETING,CONFIGURING"
TIMEOUT_S = 60


def one_line(text: str, limit: int = REASON_MAX) -> str:
    """``text`` as one printable line of at most ``limit`` characters (a Reason)."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def is_own(reason: str) -> bool:
    return reason == OWN or reason.startswith((f"{OWN}:", FAILED))


@dataclass
class SlurmDrains:
    """The Slurm side of one roll: the controller, each node's Slurm name, and what the roll
    found and did on each node (``notes``, shown in the node's result)."""

    controller: NodeRecord
    files: ClusterFiles
    names: dict[str, str]  # gpuprov node -> Slurm NodeName
    run: str  # the roll's words in each Reason it writes
    grace: int = GRACE_S
    force: bool = False
    kept: dict[str, str] = field(default_factory=dict)  # nodes drained by someone else: their Reason
    notes: dict[str, str] = field(default_factory=dict)
    sleep: Callable[[float], None] = time.sleep

    # -- reading ---------------------------------------------------------------------------
    def state(self, host: str) -> tuple[str, str]:
        """(state, reason) of ``host`` as sinfo shows it (state lower case, no ``*``)."""
        out = self._on_controller("sinfo", "--noheader", "--Node", f"--nodes={self.names[host]}",
                                  "--format=%T|%E")
        line = next((ln for ln in printable(out, lines=True).splitlines() if ln.strip()), "")
        state, _, reason = line.strip().partition("|")
        if not state:
            raise GpuprovError(f"sinfo on {self.controller.name} does not list {self.names[host]}")
        reason = reason.strip()
        return state.strip().rstrip("*~#!%$@^-").lower(), "" if reason == "none" else reason

    def busy(self, host: str) -> list[str]:
        """The ids of the jobs running (or completing, or starting) on ``host``."""
        out = self._on_controller("squeue", "--noheader", f"--nodelist={self.names[host]}",
                                  f"--states={BUSY_STATES}", "--format=%i")
        return [ln.strip() for ln in out.splitlines() if ln.strip()]

    # -- the roll's steps ------------------------------------------------------------------
    def drain(self, host: str) -> tuple[bool, str]:
        """Drain ``host`` (unless someone else has), then wait for its jobs: (ok, error)."""
        try:
            state, reason = self.state(host)
            if "drain" in state and reason.startswith(HEALTH):
                # Held by the roll from here: the health program resumes only its own Reason.
                self._update(host, "DRAIN", one_line(f"{OWN}: {self.run} (was {reason})"))
                self._note(host, f"drained by its health before the roll ({reason}): the roll holds it")
            elif "drain" in state and reason and not is_own(reason):
                self.kept[host] = reason
                self._note(host, f"drained before the roll ({reason}): left so")
            else:
                self._update(host, "DRAIN", f"{OWN}: {self.run}")
                self._note(host, "drained")
            return self._wait(host)
        except GpuprovError as exc:
            return False, f"slurm drain: {exc}"

    def resume(self, host: str) -> None:
        """A healthy node back to work: resumed when the Reason is still the roll's own."""
        if host in self.kept:
            return
        try:
            state, reason = self.state(host)
            if "drain" in state and is_own(reason):
                self._update(host, "RESUME")
                self._note(host, "resumed")
            else:
                self._note(host, f"not resumed: {state}" + (f" ({reason})" if reason else ""))
        except GpuprovError as exc:
            self._note(host, f"not resumed: {exc}")

    def hold(self, host: str) -> None:
        """A patched node whose GPUs now share as Slurm does not know yet: kept drained, the
        Reason saying so (a node someone else drained keeps theirs)."""
        if host in self.kept:
            return
        try:
            self._update(host, "DRAIN", f"{HELD}: {self.run}")
            self._note(host, "held drained until Slurm has the new GPU sharing")
        except GpuprovError as exc:
            self._note(host, f"could not be held: {exc}")

    def resume_held(self) -> list[str]:
        """Every node held for the GPU sharing (by this roll or an earlier one), resumed: the
        nodes resumed."""
        resumed = []
        for host in self.names:
            try:
                state, reason = self.state(host)
                if "drain" in state and reason.startswith(HELD):
                    self._update(host, "RESUME")
                    self._note(host, "resumed (Slurm has the new GPU sharing)")
                    resumed.append(host)
            except GpuprovError as exc:
                self._note(host, f"not resumed: {exc}")
        return resumed

    def failed(self, host: str, error: str) -> None:
        """A node that failed: it stays drained, the Reason saying why (a node someone else
        drained keeps theirs)."""
        if host in self.kept:
            return
        try:
            self._update(host, "DRAIN", one_line(f"{FAILED}: {error}"))
            self._note(host, "left drained")
        except GpuprovError as exc:
            self._note(host, f"could not be left drained: {exc}")

    # -- the controller ----------------------------------------------------------------------
    def _wait(self, host: str) -> tuple[bool, str]:
        jobs = self.busy(host)
        if self.force:
            if jobs:
                self._note(host, f"--force: not waiting for job(s) {', '.join(jobs)}")
            return True, ""
        deadline = time.monotonic() + self.grace
        waited = False
        while jobs:
            if time.monotonic() >= deadline:
                return False, (f"{len(jobs)} job(s) still running on {self.names[host]} after the "
                               f"{self.grace} s grace time ({', '.join(jobs)}): not patched, left drained "
                               "(no new job lands there); run again when they end, or give --force")
            waited = True
            self.sleep(POLL_S)
            jobs = self.busy(host)
        if waited:
            self._note(host, "waited for its jobs to end")
        return True, ""

    def _note(self, host: str, text: str) -> None:
        self.notes[host] = f"{self.notes[host]}; {text}" if self.notes.get(host) else text

    def _update(self, host: str, state: str, reason: str | None = None) -> None:
        words = ["update", f"NodeName={self.names[host]}", f"State={state}"]
        if reason is not None:
            words.append(f"Reason={reason}")
        self._on_controller("sudo", "-n", "scontrol", *words)

    def _on_controller(self, *argv: str) -> str:
        return run_on(self.controller, self.files, argv)


def run_on(node: NodeRecord, files: ClusterFiles, argv: Sequence[str], timeout: int = TIMEOUT_S) -> str:
    """``argv`` (fixed words, quoted for the node's shell) on ``node`` over its pinned SSH
    connection: its standard output (``GpuprovError`` with one line when it fails)."""
    cmd = ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.login_key)),
           "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}",
           shlex.join(argv)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"{argv[0] if argv[0] != 'sudo' else argv[2]} on {node.name}: "
                           f"no answer within {timeout}s") from None
    if proc.returncode != 0:
        raise GpuprovError(f"{shlex.join(argv[:4])} on {node.name}: "
                           + ssh.ssh_error_line(proc.stderr, proc.returncode))
    return proc.stdout


def slurm_names(nodes: Sequence[NodeRecord], files: ClusterFiles) -> dict[str, str]:
    """Each node's Slurm NodeName: its short hostname (what the slurm role writes into
    slurm.conf from the node's facts), read from the node; one that breaks Slurm's name rules
    is an error."""

    def name_of(node: NodeRecord) -> str:
        found = run_on(node, files, ["uname", "-n"]).strip().split(".", 1)[0]
        if not NAME.fullmatch(found):
            raise GpuprovError(f"its hostname {found!r} is not a Slurm node name")
        return found

    return dict(zip([n.name for n in nodes], ssh.each_node(list(nodes), name_of), strict=True))
