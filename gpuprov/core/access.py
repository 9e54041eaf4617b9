"""`gpuprov access grant|revoke|list`: each operator's own SSH public key, recorded in the
cluster's record (``spec.access``: {name: {key, fingerprint, granted_by, at}}), so that a team
shares a cluster without sharing its private key (docs/team-state.md).

A key file is taken only as one public key line of a type OpenSSH signs with (ed25519, ECDSA
P-256/384/521, RSA of 2048 bits or more), its blob decoded and its own type checked: no option
prefix (``command=``, ``from=``), no second line, no comment carried over (the recorded line is
``TYPE BLOB gpuprov-access:NAME``). A name is a POSIX-like user name: nothing a user types
becomes an authorized_keys option or a shell word.

The next `provision` (push, or `--via pull`: the same variables reach the nodes' own run) puts
each granted key in the login user's authorized_keys and takes each revoked one out
(settings.playbook_vars' ``gpuprov_access_keys``, the preflight play's gpuprov_base access
entry point); a revoked grant stays in the record, marked, until granted again. The nodes the
elastic path powers up from an image get the same keys at each resume (gpuprov.ssh.with_access),
and an operator logs in with their own granted key (gpuprov.identity).
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from pathlib import Path
from typing import Any

from gpuprov.clock import utc_text
from gpuprov.cluster import cluster_lock, load, validate_name
from gpuprov.errors import BadInput
from gpuprov.state import Store, operator

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
MAX_KEY_FILE = 16 << 10
MIN_RSA_BITS = 2048


def grant_name(value: str) -> str:
    if not NAME.fullmatch(value or ""):
        raise BadInput(f"--as {value!r}: a name of 1 to 32 lowercase letters, digits, '_' and '-', starting "
                       "with a letter (the operator the key is theirs)")
    return value


def public_key(path: Path) -> str:
    """The one public key line ``path`` holds, as ``TYPE BLOB``; bad input for anything else."""
    where = f"--key {path}"
    try:
        raw = path.read_bytes()[:MAX_KEY_FILE + 1]
    except OSError as exc:
        raise BadInput(f"{where}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_KEY_FILE or b"PRIVATE KEY" in raw:
        raise BadInput(f"{where}: not a public key file (give the .pub file, never the private key)")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise BadInput(f"{where}: not a public key line (not ASCII)") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise BadInput(f"{where}: expected one public key line, found {len(lines)}")
    fields = lines[0].split()
    if len(fields) not in (2, 3) or fields[0] not in KEY_TYPES:
        raise BadInput(f"{where}: expected TYPE BASE64 [COMMENT] with TYPE one of {', '.join(KEY_TYPES)} "
                       "(no options such as command= or from=)")
    kind, blob = fields[0], _blob(fields[1], where)
    inner = _strings(blob, where)
    if inner[0] != kind.encode():
        raise BadInput(f"{where}: the key's blob is of type {inner[0][:40]!r}, not {kind}")
    if kind == "ssh-rsa" and (len(inner) < 3 or _bits(inner[2]) < MIN_RSA_BITS):
        raise BadInput(f"{where}: an RSA key of fewer than {MIN_RSA_BITS} bits")
    return f"{kind} {fields[1]}"


def _blob(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise BadInput(f"{where}: the key's second field is not base64") from None


def _strings(blob: bytes, where: str) -> list[bytes]:
    """The SSH wire strings of a key blob (RFC 4253 section 6.6)."""
    out, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise BadInput(f"{where}: the key's blob is truncated")
        (size,) = struct.unpack(">I", blob[at:at + 4])
        if at + 4 + size > len(blob):
            raise BadInput(f"{where}: the key's blob is truncated")
        out.append(blob[at + 4:at + 4 + size])
        at += 4 + size
    if not out:
        raise BadInput(f"{where}: the key's blob is empty")
    return out


def _bits(number: bytes) -> int:
    return int.from_bytes(number, "big").bit_length()


def fingerprint(line: str) -> str:
    digest = hashlib.sha256(base64.b64decode(line.split()[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def grant(name: str, key_file: Path, as_name: str, store: Store | None = None) -> dict[str, Any]:
    """Record ``as_name``'s public key on the cluster; one grant per name (a new key replaces
    the old, which the next `provision` takes off the nodes)."""
    validate_name(name)
    line, who = public_key(key_file), grant_name(as_name)
    store = store or Store()
    load(store, name)
    entry: dict[str, Any] = {"key": f"{line} gpuprov-access:{who}", "fingerprint": fingerprint(line),
                             "granted_by": operator(), "at": utc_text()}
    with cluster_lock(name):
        cluster = load(store, name)
        before = (cluster.spec.get("access") or {}).get(who) or {}
        # A key of theirs granted before and not this one: taken off the nodes by the next provision.
        replaced = [k for k in [*before.get("replaced", []), before.get("key")] if k and k != entry["key"]]
        if replaced:
            entry["replaced"] = replaced
        access = {**(cluster.spec.get("access") or {}), who: entry}
        store.set_spec(name, {**cluster.spec, "access": dict(sorted(access.items()))})
    return entry


def revoke(name: str, as_name: str, store: Store | None = None) -> bool:
    """Mark ``as_name``'s grant revoked (its key kept, so that the next `provision` removes it
    from the nodes); False where there was none in force."""
    validate_name(name)
    who = grant_name(as_name)
    store = store or Store()
    load(store, name)
    with cluster_lock(name):
        cluster = load(store, name)
        access = dict(cluster.spec.get("access") or {})
        entry = access.get(who)
        if entry is None or entry.get("revoked_at"):
            return False
        access[who] = {**entry, "revoked_by": operator(), "revoked_at": utc_text()}
        store.set_spec(name, {**cluster.spec, "access": access})
    return True


def listed(name: str, store: Store | None = None) -> dict[str, dict[str, Any]]:
    validate_name(name)
    return dict(load(store or Store(), name).spec.get("access") or {})
