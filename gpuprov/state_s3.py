"""The state on S3: a team's cluster records, their runs and their locks under one prefix of a
bucket of this account (``GPUPROV_STATE=s3://BUCKET/PREFIX``; docs/team-state.md).

Objects, under PREFIX/:

- ``clusters/NAME.json``: the cluster's record (state.record_bytes: the same JSON `state push`
  writes and `state pull` reads), with who changed it last and when;
- ``runs/NAME/ID.json``: one object per run (ID grows with the time it started);
- ``locks/NAME.json``: the cluster's lock while a mutating command runs.

S3's conditional writes do what the local file's transactions and flock do:

- a new record, run or lock is put with ``If-None-Match: *``: a second create of the same key is
  refused by S3 (412), so two operators cannot both make a cluster, both take a free lock;
- every change of a record is put with ``If-Match`` the ETag this process read it at. Where S3
  answers 412 (another process wrote it since), the record is read again and the change
  applied again, field by field (for the spec, key by key) from what this process read: a
  field the other writer changed and this one did not keeps the other's value; a field both
  changed, to different values, stops the command with one line. Never last-writer-wins;
- the lock is a lease: it says until when, and the holder puts it again (``If-Match``, a thread)
  every third of the lease while the command runs. One whose time has passed (its holder was
  killed, or its machine lost) is taken over with ``If-Match`` its ETag, so of two takers only
  one wins, with a line saying whose it was. One broken under a live holder (`gpuprov unlock
  NAME --force`) is noticed at the next renewal: that holder's later record writes are refused.

What never goes in the bucket: the cluster's SSH private key, its munge key, registry
credentials (they stay in the state directory of the operator who made them; every put is
checked for a private key). Operators reach the nodes with their own keys (gpuprov.core.access).

Every call passes ``ExpectedBucketOwner`` (this account, from STS: providers/aws/s3.client), and
the bucket's own settings are checked once from each state directory (state_bucket.checked).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from gpuprov import paths
from gpuprov.clock import utc_text
from gpuprov.console import Console
from gpuprov.errors import BadInput, ClusterBusy, GpuprovError
from gpuprov.lock.lock_data import LockData
from gpuprov.lock_holder import alive, holder_text
from gpuprov.providers import ClusterFiles
from gpuprov.providers.aws import api, s3, state_bucket
from gpuprov.state import (
    BACKENDS,
    ClusterRecord,
    NodeRecord,
    RunRecord,
    Store,
    now,
    operator,
    record_bytes,
    record_dict,
    record_of,
)
from gpuprov.state_choice import S3Location, chosen

LEASE_ENV = "GPUPROV_STATE_LEASE_S"
DEFAULT_LEASE_S = 60.0
ATTEMPTS = 12  # puts of one change against writers in between, before it stops with one line
BACKOFF_S = 0.02  # the first pause after a refused put (random, up to this, doubling to 32x)
_RUN_KEYS: dict[int, str] = {}  # run id -> its key, for the runs this process started
_LOST: dict[str, str] = {}  # cluster -> who broke this process's lock on it
_DELETED: set[str] = set()  # clusters this process removed (`down`): nothing of theirs is put again
SENT: Counter[str] = Counter()  # S3 requests this process's state stores made, by operation
_CONNECTIONS: dict[str, tuple[Any, str]] = {}  # bucket -> (S3 client, this account)


def _connection(where: S3Location) -> tuple[Any, str]:
    """One S3 client per process and bucket (a command opens many stores; boto3's session, the
    account from STS and the bucket's check are paid once): (client, this account)."""
    if where.bucket not in _CONNECTIONS:
        aws = api.connect(None)
        client = s3.client(aws)
        client.meta.events.register("before-call.s3", _count, unique_id="gpuprov-state-count")
        # An endpoint that does not answer: one line naming it, as from every client of api's.
        client.meta.events.register("after-call-error", api._unreachable_hook("s3", client.meta.endpoint_url))
        state_bucket.checked(aws, where)
        _CONNECTIONS[where.bucket] = (client, aws.account)
    return _CONNECTIONS[where.bucket]


def _count(model: Any, **_: Any) -> None:
    SENT[model.name] += 1


def lease_s() -> float:
    """How long a lock lasts unless renewed: GPUPROV_STATE_LEASE_S, else 60 s."""
    value = os.environ.get(LEASE_ENV, "")
    try:
        lease = float(value) if value else DEFAULT_LEASE_S
    except ValueError:
        lease = -1.0
    if not 1.0 <= lease <= 3600.0:
        raise BadInput(f"{LEASE_ENV}={value!r}: seconds from 1 to 3600 (default {DEFAULT_LEASE_S:g})")
    return lease


class Conflict(Exception):
    """A conditional put S3 refused (412): the object changed since it was read."""


class S3Store(Store):
    """The records, runs and locks under ``s3://BUCKET/PREFIX/`` (the module's docstring)."""

    def __init__(self, path: Any = None, location: S3Location | None = None) -> None:
        where = location or chosen()
        assert where is not None  # Store() opens this one only for an S3 location
        self.loc = where
        self._s3: Any = None
        self._account = ""
        self._seen: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (ETag, record) as read

    def where(self) -> str:
        return self.loc.url

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def requests(self) -> int:
        """S3 requests this process's state stores made (docs/team-state.md's figures)."""
        return sum(SENT.values())

    def client(self) -> Any:
        if self._s3 is None:
            self._s3, self._account = _connection(self.loc)
        return self._s3

    def key_of(self, kind: str, name: str) -> str:
        """The key of a cluster's record (kind "clusters") or lock ("locks")."""
        return f"{self.loc.prefix}{kind}/{name}.json"

    @contextmanager
    def _refusals(self, what: str) -> Iterator[None]:
        """S3's refusals of a state call as one line each; a 412 as Conflict."""
        try:
            yield
        except api.ClientError as exc:
            code = api.error_code(exc)
            if code == "PreconditionFailed" or (code == "NoSuchKey" and "PutObject" in what):
                raise Conflict(what) from None  # a put If-Match of a key deleted since: changed too
            if code == "NoSuchBucket":
                raise BadInput(f"state bucket {self.loc.bucket} does not exist; `gpuprov state bucket "
                               f"{self.loc.url}` makes one") from None
            if code in s3.DENIED:
                raise GpuprovError(f"AWS refuses {what} in {self.loc.url} for these credentials, or the bucket is "
                                   f"not this account's ({self._account}: gpuprov uses no other's); "
                                   "docs/aws-iam-policy-state.json says what an operator needs") from None
            raise GpuprovError(f"{what} in {self.loc.url} failed: {code}: {api.error_message(exc)}") from None

    def get(self, key: str) -> tuple[str, bytes] | None:
        """(ETag, body) of ``key``; None where there is none."""
        client = self.client()
        with self._refusals(f"s3:GetObject {key}"):
            try:
                answer = client.get_object(Bucket=self.loc.bucket, Key=key)
            except api.ClientError as exc:
                if api.error_code(exc) == "NoSuchKey":
                    return None
                raise
            return str(answer["ETag"]), answer["Body"].read()

    def put(self, key: str, body: bytes, *, etag: str | None = None) -> str:
        """Put ``body`` at ``key``: created (etag None: refused where it exists) or replacing the
        version ``etag`` names. The new ETag; Conflict where S3 refused the condition."""
        if b"PRIVATE KEY" in body:
            raise GpuprovError(f"refused to write {key} to {self.loc.url}: it holds a private key (the state "
                               "bucket never holds one; docs/team-state.md)")
        condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
        client = self.client()
        with self._refusals(f"s3:PutObject {key}"):
            answer = client.put_object(Bucket=self.loc.bucket, Key=key, Body=body,
                                   ContentType="application/json", **condition)
        return str(answer["ETag"])

    def delete(self, key: str, etag: str | None = None) -> None:
        """Delete ``key`` (only the version ``etag`` names, where given). Conflict where it
        changed; nothing where it is gone already."""
        client = self.client()
        with self._refusals(f"s3:DeleteObject {key}"):
            try:
                client.delete_object(Bucket=self.loc.bucket, Key=key, **({"IfMatch": etag} if etag else {}))
            except api.ClientError as exc:
                if api.error_code(exc) != "NoSuchKey":
                    raise

    def keys(self, under: str) -> list[str]:
        client, out = self.client(), list[str]()
        with self._refusals(f"s3:ListBucket {under}"):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.loc.bucket, Prefix=under):
                out.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(out)

    # -- records ----------------------------------------------------------------------------
    def read(self, name: str) -> tuple[str, dict[str, Any]] | None:
        found = self.get(self.key_of("clusters", name))
        if found is None:
            self._seen.pop(name, None)
            return None
        try:
            record = json.loads(found[1])
            record_of(record)
        except (ValueError, TypeError, KeyError):
            raise GpuprovError(f"{self.loc.url}: {self.key_of('clusters', name)} is not a cluster record; "
                               "restore an earlier version of it (the bucket keeps them)") from None
        self._seen[name] = (found[0], record)
        return self._seen[name]

    def create_cluster(self, name: str, provider: str, spec: dict[str, Any],
                       lock: LockData | None = None) -> ClusterRecord:
        self._not_lost(name)
        _DELETED.discard(name)
        by, at = operator(), now()
        record = record_dict(ClusterRecord(name=name, provider=provider, created=at, state="launching", spec=spec,
                                           lock=lock, changed_by=by, changed_at=at))
        try:
            etag = self.put(self.key_of("clusters", name), record_bytes(record))
        except Conflict:
            raise KeyError(name) from None
        self._seen[name] = (etag, record)
        return record_of(record)

    def get_cluster(self, name: str) -> ClusterRecord | None:
        found = self.read(name)
        return record_of(found[1]) if found else None

    def list_clusters(self) -> list[ClusterRecord]:
        under = f"{self.loc.prefix}clusters/"
        names = [k[len(under):-len(".json")] for k in self.keys(under) if k.endswith(".json")]
        found = [c for c in (self.get_cluster(n) for n in names) if c is not None]
        return sorted(found, key=lambda c: (c.created, c.name))

    def update(self, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """``change`` applied to the record as this process read it, put with If-Match its ETag;
        where another writer came in between, applied again onto theirs (merge)."""
        self._not_lost(name)
        base = self._seen.get(name) or self.read(name)
        if base is None:
            return  # no such cluster: as an UPDATE of no row
        etag, current = base
        ours = change(current)
        for attempt in range(ATTEMPTS):
            stamped = {**merge(base[1], ours, current), "changed_by": operator(), "changed_at": now()}
            try:
                new = self.put(self.key_of("clusters", name), record_bytes(stamped), etag=etag)
            except Conflict:
                time.sleep(random.uniform(0, BACKOFF_S * 2 ** min(attempt, 5)))  # the other writer goes first
                again = self.read(name)
                if again is None:
                    raise GpuprovError(f"cluster '{name}' was removed from {self.loc.url} while this command "
                                       "changed it; nothing written") from None
                etag, current = again
                continue
            self._seen[name] = (new, stamped)
            return
        raise GpuprovError(f"cluster '{name}' in {self.loc.url} kept changing under this command ({ATTEMPTS} "
                           "writes refused by S3's If-Match); nothing written, run it again")

    def set_cluster_state(self, name: str, state: str) -> None:
        self.update(name, lambda r: {**r, "state": state, "failed_step": None})

    def set_failed_step(self, name: str, step: str | None) -> None:
        self.update(name, lambda r: {**r, "failed_step": step})

    def set_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.update(name, lambda r: {**r, "spec": json.loads(json.dumps(spec))})

    def set_lock(self, name: str, lock: LockData | None) -> None:
        self.update(name, lambda r: {**r, "lock": json.loads(json.dumps(lock))})

    def replace_nodes(self, cluster: str, nodes: Sequence[NodeRecord]) -> None:
        listed = record_dict(ClusterRecord("", "", "", "", {}, None, nodes=tuple(nodes)))["nodes"]
        self.update(cluster, lambda r: {**r, "nodes": listed})

    def delete_cluster(self, name: str) -> None:
        self._not_lost(name)
        self.delete(self.key_of("clusters", name))
        self.delete(f"{self.loc.prefix}hosts/{name}.known_hosts")
        _DELETED.add(name)
        for key in self.keys(f"{self.loc.prefix}runs/{name}/"):
            self.delete(key)
        self._seen.pop(name, None)

    def import_record(self, record: ClusterRecord, etag: str | None) -> None:
        """`state push`: the record as it is, in place of the version ``etag`` names (None: a
        new one). Conflict where that is not what is there."""
        self.put(self.key_of("clusters", record.name), record_bytes(record_dict(record)), etag=etag)

    def _not_lost(self, name: str) -> None:
        if name in _LOST:
            raise GpuprovError(f"this command's lock on cluster '{name}' was broken ({_LOST[name]}); it writes "
                               "nothing more to the cluster's record: see `gpuprov status`")

    # -- runs -------------------------------------------------------------------------------
    def start_run(self, cluster: str, kind: str, artifact_dir: str | None) -> int:
        run_id = time.time_ns() // 1000
        body = {"id": 0, "cluster": cluster, "kind": kind, "started": now(), "finished": None, "ok": None,
                "artifact_dir": artifact_dir, "summary": {}, "pid": os.getpid(), "by": operator()}
        for _ in range(ATTEMPTS):
            key = f"{self.loc.prefix}runs/{cluster}/{run_id:020d}.json"
            try:
                self.put(key, _json({**body, "id": run_id}))
            except Conflict:
                run_id += 1
                continue
            _RUN_KEYS[run_id] = key
            return run_id
        raise GpuprovError(f"no free run id in {self.loc.url}/runs/{cluster}/")

    def finish_run(self, run_id: int, ok: bool, summary: dict[str, Any]) -> None:
        key = _RUN_KEYS.get(run_id) or next(
            (k for k in self.keys(f"{self.loc.prefix}runs/") if k.endswith(f"/{run_id:020d}.json")), None)
        if key is not None:
            self._finish(key, lambda _: (ok, json.loads(json.dumps(summary))))

    def _finish(self, key: str, outcome: Callable[[dict[str, Any]], tuple[bool, dict[str, Any]] | None]) -> None:
        for _ in range(ATTEMPTS):
            found = self.get(key)
            if found is None:
                return
            run = json.loads(found[1])
            result = outcome(run)
            if result is None:
                return
            try:
                self.put(key, _json({**run, "finished": now(), "ok": result[0], "summary": result[1]}), etag=found[0])
                return
            except Conflict:
                continue

    def close_dead_runs(self, cluster: str) -> None:
        self.runs(cluster, limit=50)

    def runs(self, cluster: str, limit: int = 20) -> list[RunRecord]:
        """The last ``limit`` runs, newest first; a run of this machine whose process is gone is
        closed as interrupted (a run of another machine is that machine's to close)."""
        out = []
        me = operator()
        for key in self.keys(f"{self.loc.prefix}runs/{cluster}/")[::-1][:limit]:
            found = self.get(key)
            if found is None:
                continue
            run = json.loads(found[1])
            if run.get("finished") is None and run.get("by") == me and not alive(int(run.get("pid") or 0)):
                self._finish(key, _interrupted)
                run = json.loads((self.get(key) or found)[1])
            out.append(RunRecord(id=int(run["id"]), cluster=run["cluster"], kind=run["kind"], started=run["started"],
                                 finished=run["finished"], ok=run["ok"], artifact_dir=run["artifact_dir"],
                                 summary=run["summary"]))
        return out

    # -- the lock ---------------------------------------------------------------------------
    @contextmanager
    def hold(self, name: str, who: dict[str, Any]) -> Iterator[None]:
        """The cluster's lock, and its pinned host keys brought here when taken and shared when
        released (PinnedHosts)."""
        with Lease(self, name, who).held():
            hosts = PinnedHosts(self, name)
            hosts.fetch()
            try:
                yield
            finally:
                if name not in _LOST:
                    hosts.share()


class PinnedHosts:
    """A cluster's pinned host keys (its known_hosts: public), shared through the bucket as
    ``hosts/NAME.known_hosts``, so that every operator's gpuprov checks the nodes against the
    same keys. Under the cluster's lock the bucket's copy is the newest (the last mutating
    command put it): taken, it replaces this machine's; at the end of the command, this
    machine's (which the command may have pinned anew) is put back, If-Match what was read."""

    def __init__(self, store: S3Store, name: str) -> None:
        self.store, self.name = store, name
        self.key = f"{store.loc.prefix}hosts/{name}.known_hosts"
        self.path = ClusterFiles(paths.cluster_dir(name, create=False)).known_hosts
        self.etag: str | None = None
        self.seen: bytes | None = None

    def fetch(self) -> None:
        found = self.store.get(self.key)
        if found is None:
            return
        self.etag, self.seen = found
        if not self.path.is_file() or self.path.read_bytes() != self.seen:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".known_hosts.{os.getpid()}")
            tmp.write_bytes(self.seen)
            tmp.chmod(0o600)
            tmp.replace(self.path)

    def push(self) -> None:
        """`state push`: this machine's copy into the bucket, whatever is there."""
        found = self.store.get(self.key)
        self.etag, self.seen = found if found else (None, None)
        self.share()

    def share(self) -> None:
        if self.name in _DELETED or not self.path.is_file():
            return
        data = self.path.read_bytes()
        if data == self.seen:
            return
        try:
            self.etag, self.seen = self.store.put(self.key, data, etag=self.etag), data
        except (Conflict, GpuprovError) as exc:
            Console().say(f"warning: cluster '{self.name}': its pinned host keys were not shared through "
                          f"{self.store.where()} ({exc or 'changed there since'}); the next command here shares them")


class Lease:
    """One command's lock on one cluster: ``locks/NAME.json``, put with If-None-Match, renewed
    by a thread, deleted (If-Match its ETag) when the command ends."""

    def __init__(self, store: S3Store, name: str, who: dict[str, Any]) -> None:
        self.store, self.name, self.lease = store, name, lease_s()
        self.key = store.key_of("locks", name)
        self.who = {**who, "by": operator(), "cluster": name}
        self.etag = ""
        self.stop = threading.Event()

    def body(self) -> bytes:
        until = time.time() + self.lease
        return _json({**self.who, "until": utc_text_exact(until), "until_s": until, "lease_s": self.lease})

    @contextmanager
    def held(self) -> Iterator[None]:
        self.take()
        _LOST.pop(self.name, None)
        renewer = threading.Thread(target=self.renew, name=f"gpuprov-lease-{self.name}", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            self.stop.set()
            renewer.join(timeout=10)
            if self.name not in _LOST:
                self.release()

    def release(self) -> None:
        try:
            self.store.delete(self.key, etag=self.etag)
        except Conflict:
            pass  # broken and taken since: not this command's to delete
        except GpuprovError as exc:  # S3 not reached: said, and the command's own outcome stands
            Console().say(f"warning: the lock of cluster '{self.name}' was not released ({exc}); its lease "
                          f"ends it within {self.lease:g} s")

    def take(self) -> None:
        for _ in range(ATTEMPTS):
            try:
                self.etag = self.store.put(self.key, self.body())
                return
            except Conflict:
                pass
            found = self.store.get(self.key)
            if found is None:
                continue  # released in between: try again
            held = _held(found[1])
            if float(held.get("until_s") or 0) > time.time():
                raise ClusterBusy(f"cluster '{self.name}' is busy: {holder_text(held)}")
            try:
                self.etag = self.store.put(self.key, self.body(), etag=found[0])
            except Conflict:
                continue  # another taker won: read whose it is now
            Console().say(f"warning: took over the lock of cluster '{self.name}' from {holder_text(held)}: its "
                          "lease ran out (its holder stopped renewing it: killed, or its machine lost)")
            return
        raise GpuprovError(f"cluster '{self.name}': its lock in {self.store.where()} kept changing; run it again")

    def renew(self) -> None:
        while not self.stop.wait(self.lease / 3):
            try:
                self.etag = self.store.put(self.key, self.body(), etag=self.etag)
            except Conflict:
                found = self.store.get(self.key)
                now_held = holder_text(_held(found[1])) if found else "no one holds it now"
                _LOST[self.name] = f"broken by `gpuprov unlock --force`; {now_held}"
                Console().say(f"warning: this command's lock on cluster '{self.name}' was broken; {now_held}; "
                              "it writes nothing more to the cluster's record")
                return
            except Exception:  # noqa: BLE001  (S3 not reached this time: the next renewal tries again)
                continue


def _interrupted(run: dict[str, Any]) -> tuple[bool, dict[str, Any]] | None:
    """A run of this machine whose process is gone: failed, interrupted (unless closed since)."""
    if run.get("finished"):
        return None
    return False, {"interrupted": f"its gpuprov process (pid {run.get('pid')}) ended before the run did"}


def read_lock(store: S3Store, name: str) -> tuple[str, dict[str, Any]] | None:
    found = store.get(store.key_of("locks", name))
    return (found[0], _held(found[1])) if found else None


def live(held: dict[str, Any]) -> bool:
    return float(held.get("until_s") or 0) > time.time()


def _held(raw: bytes) -> dict[str, Any]:
    try:
        held = json.loads(raw)
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def utc_text_exact(epoch: float) -> str:
    return utc_text(datetime.fromtimestamp(epoch, UTC))


def _json(value: dict[str, Any]) -> bytes:
    return (json.dumps(value, sort_keys=True, indent=1) + "\n").encode()


def merge(base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Our change (``base`` -> ``ours``) applied onto ``theirs``: field by field, and key by key in
    the spec. A field both changed, to different values, is a conflict (GpuprovError naming the
    field and who changed it when)."""
    return _merged(base, ours, theirs, theirs, "")


def _merged(base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any], record: dict[str, Any],
            under: str) -> dict[str, Any]:
    out = dict(theirs)
    for field in sorted(set(base) | set(ours)):
        mine, was = ours.get(field), base.get(field)
        if mine == was or (not under and field in ("changed_by", "changed_at")):
            continue
        other = theirs.get(field)
        if not under and field == "spec" and all(isinstance(v, dict) for v in (mine, was, other)):
            out["spec"] = _merged(was, mine, other, record, "spec.")  # type: ignore[arg-type]
            continue
        if other not in (was, mine):
            raise GpuprovError(f"cluster '{record.get('name', '?')}': {under}{field} was changed by "
                               f"{record.get('changed_by') or 'another operator'} at {record.get('changed_at')} "
                               "while this command changed it too; nothing written: see `gpuprov status`, run it again")
        out[field] = mine
    return {k: v for k, v in out.items() if k in ours or k not in base}


BACKENDS["s3"] = S3Store  # Store() opens it where the state chosen is on S3


def make_bucket(where: S3Location, kms_key: str | None, report: Any) -> None:
    """`state bucket`: the state's bucket made, or checked, with every setting it needs."""
    state_bucket.create(api.connect(None), where, kms_key, report)


def check_bucket(where: S3Location) -> None:
    """The state's bucket checked (this account's, with every setting it needs), or refused."""
    state_bucket.checked(api.connect(None), where)
