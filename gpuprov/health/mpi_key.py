"""The key that lets the launcher of a run across nodes (gpuprov.health.cluster_nccl) log in
to the other nodes, for that run only: its line in the login user's authorized_keys, the
scripts that add it and take it away on a node, and the guard that takes it away when
gpuprov is interrupted.

What holds, whatever happens to the run:

- The line is the run's and no one else's: the run's id (``gpuprov-mpi-`` and 12 hex digits,
  made here) as its comment, ``from=`` the launcher's own address, ``restrict`` (no
  forwarding, no pty, no ~/.ssh/rc) and ``expiry-time=`` (OpenSSH 8.2 and later, in UTC:
  the ``Z``; Debian 12 has 9.2): a line that outlives its run (a node unreachable at the
  cleanup) stops opening anything at its expiry, and the next run's first step removes it.
- Adding it never merges it with the line before (a file without a final newline gets one
  first); removing it removes exactly its line and the expired lines of earlier runs, no
  other line, and never leaves a short file: the new content is written in full to a file
  in the same directory, which then replaces the old one (rename: one step, with the old
  file's mode and owner); a failure on the way (a full disk) leaves the old file as it was.
- Every node's cleanup is tried, whatever happened to the others, at the same time, each
  within its own time; the nodes where it failed are named with why.
- SIGTERM or SIGINT while the key is out: the cleanup runs, then gpuprov exits as
  interrupted (``Interrupted``: 128 + the signal's number).
"""

from __future__ import annotations

import ipaddress
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import FrameType

from gpuprov.errors import GpuprovError
from gpuprov.ssh import ssh_error_line

MARK = "gpuprov-mpi-"
RUN_ID = re.compile(r"gpuprov-mpi-[0-9a-f]{12}")
# mpirun logs in once per node when it starts the run (sshd checks expiry-time at the login
# only: a run that has started is not cut off by it); the rest is room for the nodes' clocks.
LIFETIME = timedelta(minutes=30)
CLEANUP_TIMEOUT_S = 60
_PUBLIC_KEY = re.compile(r"(ssh-ed25519) ([A-Za-z0-9+/]+={0,2})")
_EXPIRY = re.compile(r"[0-9]{12}Z")

# Run on each node with the run's key line on stdin: sh -c SCRIPT sh MODE RUN_ID, where MODE
# is `add` (remove the expired lines of earlier runs, then append the line) or `remove` (kill
# what is left of the run on the launcher, remove its directory, then remove its line and
# the expired ones). Every gpuprov run on the node takes the .ssh directory's lock for its
# read-modify-write (flock on the directory itself: nothing is created for it), so two runs
# never lose each other's lines.
#
# The replacement: the new content goes to a temporary file in the same directory, with the
# old file's mode and owner, renamed over the old file (one step: sshd sees the old file or
# the new one, never a part). The old cleanup rewrote the file in place because a login may
# be able to write authorized_keys and not its directory; that case is kept, as the fallback
# only: when the directory is not writable (or the temporary file cannot take the owner),
# the full new content is first produced in memory (/dev/shm, else $TMPDIR) and checked,
# then written over the old bytes without truncating first and cut to its length after:
# the file is never empty on the way, and a shorter content needs no new block (on a file
# system that writes in place, as ext4, xfs and tmpfs do).
# A failure before that point (grep's exit above 1, a full disk, no temporary file) leaves
# authorized_keys untouched and says why on stderr (exit 1).
SCRIPT = r"""
set -u
mode=$1 run=$2
line=$(cat)
fail() { printf '%s' "$*" | tr '\n' ' ' >&2; echo >&2; exit 1; }  # one line, whatever grep said
[ -n "$line" ] || fail "no key line on stdin"
t=""
trap 'rm -f ${t:+"$t"}' EXIT  # a temporary file never stays, whatever ends the script
trap 'exit 1' HUP INT TERM
if [ "$mode" = remove ]; then
  # The run's mpirun, if it still runs (gpuprov interrupted): one SIGTERM, to mpirun alone
  # (a second one, as `timeout` would forward, makes it exit without stopping its ranks).
  pkill -TERM -u "$(id -u)" -f "^mpirun --hostfile /dev/shm/$run/hostfile " 2>/dev/null
  rm -rf "/dev/shm/$run" || fail "could not remove /dev/shm/$run"
fi
umask 077
keys="$HOME/.ssh/authorized_keys"
if [ "$mode" = add ]; then
  mkdir -p "$HOME/.ssh" || fail "could not make $HOME/.ssh"
  [ -e "$keys" ] || : >> "$keys" || fail "could not create $keys"
fi
[ -e "$keys" ] || exit 0
f=$(readlink -f "$keys") && [ -f "$f" ] || fail "$keys is not a file"
d=$(dirname "$f")
exec 9<"$d" && flock -w 20 9 || fail "another run holds the lock on $d"
now=$(date -u +%Y%m%d%H%M) || fail "no clock"
drop=$(awk -v now="$now" '
  $NF ~ /^gpuprov-mpi-[0-9a-f]+$/ && match($1, /(^|,)expiry-time="[0-9]+Z"(,|$)/) {
    t = substr($1, RSTART, RLENGTH); sub(/^,?expiry-time="/, "", t); sub(/Z".*$/, "", t)
    if (length(t) == 12 && t < now) print
  }' "$f") || fail "could not read $f"
if [ "$mode" = remove ]; then
  drop=$(printf '%s\n%s' "$line" "$drop")
fi
if [ -n "$drop" ]; then
  grep -qxF -e "$drop" "$f"; found=$?
  [ "$found" -le 1 ] || fail "could not read $f"
  if [ "$found" = 0 ]; then
    if [ -w "$d" ]; then
      t=$(mktemp "$d/.authorized_keys.XXXXXX") || fail "no room for a temporary file in $d"
      err=$(grep -vxF -e "$drop" "$f" 2>&1 > "$t")
      [ $? -le 1 ] || { rm -f "$t"; fail "could not write the new $f (${err:-grep failed}); left as it was"; }
      if chmod --reference="$f" "$t" && chown --reference="$f" "$t" 2>/dev/null; then
        mv -f "$t" "$f" || { rm -f "$t"; fail "could not replace $f; left as it was"; }
        t=""; replaced=1
      fi
    fi
    if [ -z "${replaced:-}" ]; then
      [ -n "$t" ] || { t=$(mktemp -p /dev/shm 2>/dev/null || mktemp) || fail "no room for a temporary file"; }
      err=$(grep -vxF -e "$drop" "$f" 2>&1 > "$t")
      [ $? -le 1 ] || { rm -f "$t"; fail "could not produce the new $f (${err:-grep failed}); left as it was"; }
      size=$(wc -c < "$t") && cat "$t" 1<>"$f" && truncate -s "$size" "$f"
      rc=$?; rm -f "$t"; t=""
      [ "$rc" = 0 ] || fail "could not rewrite $f in place"
    fi
  fi
fi
if [ "$mode" = add ]; then
  if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then
    printf '\n' >> "$f" || fail "could not end $f with a newline"
  fi
  printf '%s\n' "$line" >> "$f" || fail "could not add the run's key to $f"
fi
exit 0
"""


class Interrupted(GpuprovError):
    """SIGTERM or SIGINT during a run that had the key out: raised after the cleanup, saying
    how it went; the exit status is the shell's for a death by that signal."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def new_run_id(token: str) -> str:
    run_id = MARK + token
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    return run_id


def expiry(now: datetime) -> str:
    """When a key made at ``now`` stops working: YYYYMMDDHHMMZ (UTC), the minute rounded up."""
    at = (now.astimezone(UTC) + LIFETIME).replace(second=0, microsecond=0) + timedelta(minutes=1)
    return at.strftime("%Y%m%d%H%MZ")


def key_line(public_key: str, run_id: str, sources: Sequence[str], expires: str) -> str:
    """The run's line for authorized_keys (no newline): every part checked, nothing else in it."""
    parts = public_key.split()
    key = _PUBLIC_KEY.fullmatch(" ".join(parts[:2])) if len(parts) in (2, 3) else None
    if key is None:
        raise ValueError("not an ed25519 public key")
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"not a run id: {run_id!r}")
    if not _EXPIRY.fullmatch(expires):
        raise ValueError(f"not an expiry time: {expires!r}")
    if not sources:
        raise ValueError("no address to let in from")
    for address in sources:
        ip = ipaddress.IPv4Address(address)  # ValueError on anything else
        if str(ip) != address or ip.is_unspecified:
            raise ValueError(f"not an address to let in from: {address!r}")
    return f'expiry-time="{expires}",from="{",".join(sources)}",restrict {key.group(1)} {key.group(2)} {run_id}'


def shown(expires: str) -> str:
    """YYYYMMDDHHMMZ as people read it."""
    return datetime.strptime(expires, "%Y%m%d%H%MZ").strftime("%Y-%m-%d %H:%M UTC")


def remote(mode: str, run_id: str) -> str:
    """The command line for a node's login shell: SCRIPT in ``mode`` for ``run_id``."""
    import shlex

    if mode not in ("add", "remove") or not RUN_ID.fullmatch(run_id):
        raise ValueError(f"{mode!r} {run_id!r}")
    return f"sh -c {shlex.quote(SCRIPT)} sh {mode} {run_id}"


def add(ssh: list[str], line: str, timeout: int = 60) -> str | None:
    """SCRIPT's ``add`` over ``ssh`` (the node's command line, SCRIPT last): None when done,
    else why not."""
    return _run(ssh, line, timeout)


def remove_everywhere(nodes: Sequence[tuple[str, list[str]]], line: str,
                      timeout: int | None = None) -> list[str]:
    """SCRIPT's ``remove`` on every (name, ssh command) at once, each within ``timeout``;
    "name: why" for each one where it failed (none: the key is gone everywhere)."""
    wait = CLEANUP_TIMEOUT_S if timeout is None else timeout

    def one(node: tuple[str, list[str]]) -> str | None:
        name, ssh = node
        try:
            why = _run(ssh, line, wait)
        except Exception as exc:  # noqa: BLE001 -- one node's failure is reported, never the others' end
            why = f"{type(exc).__name__}: {exc}"
        return None if why is None else f"{name}: {why}"

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(len(nodes), 16)) as pool:
        return [why for why in pool.map(one, nodes) if why is not None]


def _run(ssh: list[str], line: str, timeout: int) -> str | None:
    try:
        # A session of its own: a Ctrl-C at the terminal (sent to the whole foreground process
        # group) or a SIGTERM to gpuprov's group does not kill the cleanup on its way.
        proc = subprocess.run(ssh, input=line + "\n", text=True, capture_output=True, timeout=timeout, check=False,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout} s"
    if proc.returncode == 0:
        return None
    return ssh_error_line(proc.stderr, proc.returncode)


def left_line(left: Sequence[str], run_id: str, expires: str) -> str:
    return (f"the run's key ({run_id}) could not be removed from {'; '.join(left)}; "
            f"it stops working at {shown(expires)}, and the next run across nodes removes it")


class Guard:
    """SIGTERM and SIGINT (main thread only: Python's signal handlers live there) for the
    length of a run that has the key out: the first one raises ``Interrupted`` where the run
    is (the cleanup in its ``finally`` then runs); any signal after that, or during the
    cleanup, is noted, never raised, so nothing cuts the cleanup short (each node's own
    timeout bounds it). ``caught`` is the first signal's number."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.caught: int | None = None
        self._armed = False
        self._previous: dict[int, Callable | int | None] = {}

    def __enter__(self) -> Guard:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._on_signal)
        self._armed = True
        return self

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.caught is None:
            self.caught = signum
        if self._armed:
            self._armed = False
            raise Interrupted(signum, "interrupted")

    def disarm(self) -> None:
        self._armed = False

    def __exit__(self, *_exc: object) -> None:
        self._armed = False
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def interrupted(self, left: Sequence[str], run_id: str, expires: str) -> Interrupted:
        assert self.caught is not None
        name = signal.Signals(self.caught).name
        outcome = (left_line(left, run_id, expires) if left
                   else "the run's key is removed from every node")
        return Interrupted(self.caught, f"interrupted ({name}) during the run across nodes; {outcome}")
