"""`gpuprov state ...` and `gpuprov unlock`: where a team keeps its clusters' records (a prefix of
an S3 bucket: gpuprov.state_s3), moving one record between this machine and there, and
breaking a lock whose holder cannot end it (docs/team-state.md)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpuprov import identity
from gpuprov.clock import utc_text
from gpuprov.console import Console, reporter
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.lock_holder import holder_text
from gpuprov.paths import config_path
from gpuprov.state import LocalStore, Store, record_bytes, record_dict, record_of
from gpuprov.state_choice import KEY, S3Location, chosen, parse
from gpuprov.state_s3 import (
    Conflict,
    Lease,
    PinnedHosts,
    S3Store,
    check_bucket,
    live,
    make_bucket,
    read_lock,
)


def location(url: str | None, what: str) -> S3Location:
    """The S3 state a command names (``url``), else the one chosen (GPUPROV_STATE, the settings
    file); bad input where there is none."""
    found = parse(url, what) if url else chosen()
    if found is None:
        raise BadInput(f"no S3 state named: pass {what} s3://BUCKET/PREFIX, or choose one "
                       "(`gpuprov settings --set state=s3://BUCKET/PREFIX`, or GPUPROV_STATE)")
    return found


def bucket_create(url: str, kms_key: str | None, console: Console) -> None:
    """`state bucket`: the bucket, with every setting the state needs, made or checked."""
    where = location(url, "the location")
    make_bucket(where, kms_key, reporter(console))
    console.say(f"{where.url} is ready for gpuprov's state; `gpuprov settings --set state={where.url}` "
                "uses it from this machine")


def use(value: str, console: Console) -> str:
    """`settings --set state=VALUE`: this machine's state from now on (written to the settings
    file); an S3 one is checked first (this account's bucket, with the settings it needs)."""
    where = parse(value, "--set state=")
    if where is not None:
        check_bucket(where)
    path = _write_setting(KEY, where.url if where else None)
    said = where.url if where else "local (this machine's state directory)"
    console.say(f"state: {said}, written to {path}")
    return said


def use_identity(value: str, console: Console) -> str:
    """`settings --set identity=PATH`: the operator's own private key, which gpuprov's
    connections take where this machine does not hold a cluster's key (gpuprov.identity);
    ``identity=`` forgets it."""
    key = identity.parse(value, "--set identity=")
    path = _write_setting(identity.KEY, str(key) if key else None)
    said = str(key) if key else "none (only the keys of the clusters made on this machine)"
    console.say(f"identity: {said}, written to {path}")
    return said


def _write_setting(key: str, value: str | None) -> Path:
    """The settings file with ``key = "value"`` (a checked value: no quote or backslash in it),
    or without ``key`` where ``value`` is None; written whole, then renamed into place."""
    path = config_path()
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = [line for line in lines if not re.match(rf"\s*{key}\s*=", line)]
    if value is not None:
        kept.append(f'{key} = "{value}"')
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(kept) + "\n")
    tmp.replace(path)
    return path


def push(name: str, url: str | None, console: Console) -> None:
    """`state push NAME`: this machine's record of the cluster into the S3 state, unless the
    record there is newer (changed since this one was)."""
    mine = LocalStore().get_cluster(name)
    if mine is None:
        raise BadInput(f"unknown cluster '{name}' in this machine's state; `gpuprov list` shows the clusters")
    remote = S3Store(location=location(url, "--to"))
    with Lease(remote, name, _who(name, "push")).held():  # this machine's pinned host keys go too
        found = remote.read(name)
        body = record_bytes(record_dict(mine))
        if found is not None:
            if record_bytes(found[1]) == body:
                PinnedHosts(remote, name).push()
                console.say(f"cluster '{name}': {remote.where()} has this record already")
                return
            _refuse_newer(name, found[1].get("changed_at"), mine.changed_at, remote.where(), "push")
        try:
            remote.import_record(mine, found[0] if found else None)
        except Conflict:
            raise GpuprovError(f"cluster '{name}': its record in {remote.where()} changed while pushing; "
                               "nothing written, run it again") from None
        PinnedHosts(remote, name).push()
    console.say(f"cluster '{name}': pushed to {remote.where()} (last changed by {mine.changed_by} at "
                f"{mine.changed_at}), with its pinned host keys; its SSH and munge keys stay here: docs/team-state.md")


def pull(name: str, url: str | None, console: Console) -> None:
    """`state pull NAME`: the S3 state's record of the cluster onto this machine, unless the one
    here is newer."""
    remote = S3Store(location=location(url, "--from"))
    found = remote.read(name)
    if found is None:
        raise BadInput(f"unknown cluster '{name}' in {remote.where()}; `gpuprov list` (with that state) shows them")
    local = LocalStore()
    theirs = record_of(found[1])
    with local.hold(name, _who(name, "pull")):
        mine = local.get_cluster(name)
        if mine is not None:
            if record_bytes(record_dict(mine)) == record_bytes(found[1]):
                console.say(f"cluster '{name}': this machine has this record already")
                return
            _refuse_newer(name, mine.changed_at, theirs.changed_at, "this machine's state", "pull")
        local.import_record(theirs)
        PinnedHosts(remote, name).fetch()
    console.say(f"cluster '{name}': pulled from {remote.where()} into {local.where()} (last changed by "
                f"{theirs.changed_by} at {theirs.changed_at})")


def _refuse_newer(name: str, there: str | None, here: str | None, where: str, verb: str) -> None:
    if (there or "") > (here or ""):
        raise GpuprovError(f"cluster '{name}': the record in {where} is newer ({there}) than the one {verb} "
                           f"would write ({here}); nothing written: pull it first, or look at both")


def _who(name: str, what: str) -> dict[str, object]:
    return {"pid": os.getpid(), "command": ["gpuprov", "state", what, name], "since": utc_text()}


# How many renewals of the same holder's lease `unlock` follows before it gives up (a holder
# renews at a third of its lease: a few renewals are seconds of a loaded machine).
RENEWALS_FOLLOWED = 5


def _holder_of(lock: dict[str, Any]) -> tuple[object, object, object]:
    """Who holds a lock, whatever its lease: a renewal changes the lease, not these."""
    return lock.get("pid"), lock.get("by"), lock.get("since")


def unlock(name: str, force: bool, console: Console) -> None:
    """`unlock NAME`: a lock whose lease ran out is removed; a live one only with ``force``,
    naming the command it breaks. The local state's lock is the kernel's (it ends with its
    process): there is nothing to break, and the holder is named."""
    store = Store()
    if not isinstance(store, S3Store):
        raise GpuprovError(f"cluster '{name}': this machine's state locks with the kernel (flock), which "
                           "ends the lock with its process; stop the process `status` or the refusal names")
    found = read_lock(store, name)
    if found is None:
        console.say(f"cluster '{name}' is not locked in {store.where()}")
        return
    etag, held = found
    if live(held) and not force:
        raise GpuprovError(f"cluster '{name}' is locked: {holder_text(held)}; `gpuprov unlock {name} --force` "
                           "breaks it (that command then writes nothing more to the record)")
    # A live holder renews its lease while this runs: the lock changes, its holder does not. The
    # delete is conditional on what was read; a renewal by the same holder is read again and
    # followed (a few times), a lock that changed hands is never broken.
    for _ in range(RENEWALS_FOLLOWED):
        try:
            store.delete(store.key_of("locks", name), etag=etag)
            break
        except Conflict:
            again = read_lock(store, name)
            if again is None:
                console.say(f"cluster '{name}': its holder released the lock meanwhile")
                return
            etag, renewed = again
            if _holder_of(renewed) != _holder_of(held):
                raise GpuprovError(f"cluster '{name}': its lock changed hands while unlocking (now "
                                   f"{holder_text(renewed)}); nothing broken, look again") from None
            if live(renewed) and not force:
                raise GpuprovError(f"cluster '{name}' is locked: {holder_text(renewed)} renewed its lease; "
                                   f"`gpuprov unlock {name} --force` breaks it") from None
            held = renewed
    else:
        raise GpuprovError(f"cluster '{name}': its lock changed while unlocking; nothing broken, look again")
    kind = "broke the live lock" if live(held) else "removed the expired lock"
    console.say(f"cluster '{name}': {kind} of {holder_text(held)}")
