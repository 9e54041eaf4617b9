"""Host key hand-over: from the launch's bootstrap key to a key each node makes itself.

The bootstrap key (``userdata.py``) sits in user-data, readable for the
instance's whole life by anyone allowed ec2:DescribeInstanceAttribute and by
any process on the node (IMDS). It is used for one thing: the first SSH
connection, checked strictly against its pinned public half. Over that
channel gpuprov

1. has the node make its own ed25519 host key (``ssh-keygen`` under sudo,
   on the node; the private half never leaves it) and print the public half,
   which is kept locally as *pending*;
2. has the node configure sshd with that key only, delete the bootstrap key
   (and any other host key sshd would load) and reload sshd;
3. pins the node's key in known_hosts in place of the bootstrap entry, and
   connects again with strict checking: only then is the key *confirmed*
   (``hostkeys/node-ID.pub``).

Idempotent and crash-safe: a node whose own key is confirmed is only checked
with it (never again with the bootstrap key, which anyone who read user-data
holds: no downgrade); a node left between steps 1 and 3 is finished on the
next run (it offers either the bootstrap key or its pending key).
"""

from __future__ import annotations

import base64
import subprocess
import threading
from pathlib import Path

from gpuprov import ssh
from gpuprov.errors import GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles
from gpuprov.state import NodeRecord

NODE_KEY = "/etc/ssh/gpuprov_host_ed25519_key"
MARK = "gpuprov-hostkey"

# Step 1: make the node's own key once (kept if a previous run made it), print its public half.
GENERATE = f"""set -eu
umask 077
key={NODE_KEY}
if ! ssh-keygen -y -f "$key" >/dev/null 2>&1; then
  rm -f "$key.new" "$key.new.pub"
  ssh-keygen -q -t ed25519 -N '' -C "root@$(hostname)" -f "$key.new"
  mv -f "$key.new.pub" "$key.pub"
  mv -f "$key.new" "$key"
fi
printf '{MARK} %s\\n' "$(ssh-keygen -y -f "$key" | cut -d' ' -f1,2)"
"""

# Step 2: sshd uses that key only; every other host key file it would load is deleted.
ACTIVATE = f"""set -eu
umask 077
key={NODE_KEY}
ssh-keygen -y -f "$key" >/dev/null
mkdir -p /etc/ssh/sshd_config.d /etc/gpuprov
printf 'HostKey %s\\n' "$key" > /etc/ssh/sshd_config.d/10-gpuprov-hostkey.conf
sshd=$(command -v sshd || echo /usr/sbin/sshd)
for f in $("$sshd" -T 2>/dev/null | awk '$1 == "hostkey" {{print $2}}') /etc/ssh/ssh_host_*_key; do
  [ "$f" = "$key" ] || rm -f "$f" "$f.pub"
done
loaded=$("$sshd" -T | awk '$1 == "hostkey" {{print $2}}')
for f in $loaded; do
  if [ "$f" != "$key" ] && [ -e "$f" ]; then
    echo "sshd would still load the host key $f" >&2
    exit 3
  fi
done
if ! printf '%s\n' "$loaded" | grep -qx "$key"; then
  echo "sshd does not load $key (no Include of sshd_config.d?)" >&2
  exit 3
fi
"$sshd" -t
if systemctl is-active --quiet ssh.service 2>/dev/null; then
  systemctl reload ssh.service
elif systemctl is-active --quiet sshd.service 2>/dev/null; then
  systemctl reload sshd.service
else
  kill -HUP "$(cat /run/sshd.pid)"
fi
printf 'handed over %s\\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> /etc/gpuprov/hostkey-installed
echo {MARK}-active
"""

# known_hosts is rewritten whole (read, replace, rename): one writer at a time.
PIN_LOCK = threading.Lock()


def own_key_file(files: ClusterFiles, node: NodeRecord) -> Path:
    """Where the node's own, confirmed host key is kept."""
    return files.dir / "hostkeys" / f"node-{node.id}.pub"


def pending_file(record: Path) -> Path:
    return record.with_name(record.name.removesuffix(".pub") + ".pending.pub")


def pin(known_hosts: Path, node: NodeRecord, key: str) -> None:
    with PIN_LOCK:
        ssh.pin_host_keys(known_hosts, {(node.address, node.ssh_port): key})


def hand_over(
    node: NodeRecord,
    login_key: Path | None,
    known_hosts: Path,
    bootstrap: str,
    record: Path,
    *,
    timeout: float = 300.0,
) -> str | None:
    """Make sure ``node`` answers with a host key of its own, pinned and confirmed.

    ``bootstrap``: the launch's bootstrap public key; ``record``: where the node's
    own key is kept once confirmed. Returns the new key when this call handed it
    over, None when the node already had its own key (then nothing changes).
    """
    bootstrap = _key(bootstrap)
    if record.exists():
        own = _key(record.read_text())
        pin(known_hosts, node, own)
        ssh.wait_ssh(node, login_key, known_hosts, timeout=timeout)
        return None
    pending = pending_file(record)
    if pending.exists() and _key(pending.read_text()) in _offered(node):
        # A run that stopped after the node switched keys: finish it with the key the node printed.
        new = _key(pending.read_text())
    else:
        pin(known_hosts, node, bootstrap)
        ssh.wait_ssh(node, login_key, known_hosts, timeout=timeout)  # first contact, checked strictly
        out = _remote(node, login_key, known_hosts, GENERATE)
        new = _parse(node, out, bootstrap)
        record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pending.write_text(new + "\n")
        out = _remote(node, login_key, known_hosts, ACTIVATE)
        if f"{MARK}-active" not in out:
            raise GpuprovError(f"{node.name}: host key hand-over did not finish ({_last(out)})")
    pin(known_hosts, node, new)
    ssh.wait_ssh(node, login_key, known_hosts, timeout=timeout)
    pending.replace(record)
    return new


def _key(text: str) -> str:
    parts = text.split()
    if len(parts) < 2:
        raise GpuprovError(f"not a public key: {text.strip()[:40]!r}")
    return f"{parts[0]} {parts[1]}"


def _parse(node: NodeRecord, out: str, bootstrap: str) -> str:
    lines = [line.split(None, 1)[1] for line in out.splitlines() if line.startswith(MARK + " ")]
    if not lines:
        raise GpuprovError(f"{node.name}: the node printed no host key ({_last(out)})")
    key = _key(lines[-1])
    keytype, blob = key.split()
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        raise GpuprovError(f"{node.name}: the node printed a malformed host key") from None
    if keytype != "ssh-ed25519" or not raw.startswith(b"\x00\x00\x00\x0bssh-ed25519"):
        raise GpuprovError(f"{node.name}: the node printed a {keytype} key, not ssh-ed25519")
    if key == bootstrap:
        raise GpuprovError(f"{node.name}: the node's new host key is the bootstrap key; refusing it")
    return key


def _options(known_hosts: Path, login_key: Path | None) -> list[str]:
    return [
        *ssh.ssh_options(known_hosts, login_key),
        "-o", "BatchMode=yes",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "UpdateHostKeys=no",
        "-o", "ConnectTimeout=10",
    ]


def _remote(node: NodeRecord, login_key: Path | None, known_hosts: Path, script: str) -> str:
    """Run ``script`` as root on the node (sudo, script on stdin), strictly checked."""
    cmd = [
        "ssh", "-p", str(node.ssh_port), *_options(known_hosts, login_key),
        "--", f"{node.user}@{node.address}", "sudo -n /bin/sh -s",
    ]
    try:
        proc = subprocess.run(cmd, input=script, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        raise GpuprovError(f"{node.name}: host key hand-over timed out") from None
    if proc.returncode != 0:
        raise GpuprovError(f"{node.name}: host key hand-over failed (exit {proc.returncode}: {_last(proc.stderr)})")
    return proc.stdout


def _offered(node: NodeRecord) -> set[str]:
    """The ed25519 keys the node offers right now (a hint only: every use is checked strictly)."""
    proc = subprocess.run(
        ["ssh-keyscan", "-T", "5", "-t", "ed25519", "-p", str(node.ssh_port), node.address],
        capture_output=True, text=True, check=False, timeout=30,
    )
    return {f"{p[1]} {p[2]}" for p in (line.split() for line in proc.stdout.splitlines())
            if len(p) >= 3 and not p[0].startswith("#")}


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return printable(lines[-1]) if lines else "no output"
