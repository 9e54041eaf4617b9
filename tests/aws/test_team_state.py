"""The state on S3 (issue 57): two operators, alice and bob, each with a state directory of their
own on this machine, share one bucket behind moto's server (through the owner-checking front,
tests/aws/s3_front.py). Every command is the real command line in a subprocess, as an operator
runs it; the holder of a lock is a real second process in the CLI's context (as in
tests/unit/test_cluster_lock.py), killed with SIGKILL where the test says so. Leases are 2 s
(GPUPROV_STATE_LEASE_S), so nothing here sleeps long."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.aws import iam
from tests.aws.conftest import REGION
from tests.aws.s3_front import Front
from tests.conftest import GPUPROV, ROOT
from tests.lock_holder import HOLDER as LOCAL_HOLDER

BUCKET = "team-state"
STATE = f"s3://{BUCKET}/fleet"
OTHER = "210987654321"  # the account that owns a claimed bucket name

# alice's command while it runs: tests/lock_holder.py's holder, a real second process in
# the CLI's context. The command line loads the S3 backend in its group callback
# (gpuprov.cli.app); this process, which does not run it, loads it itself.
HOLDER = "import gpuprov.state_s3\n" + LOCAL_HOLDER

# One operator's writes of the record, each adding its own key to the spec, as a command that
# reads the record and writes it back does (get_cluster, then set_spec).
WRITER = """
import sys
import gpuprov.state_s3
from gpuprov.state import Store
who, count = sys.argv[1], int(sys.argv[2])
store = Store()
for i in range(count):
    spec = dict(store.get_cluster("demo").spec)
    spec[f"{who}-{i:03d}"] = i
    store.set_spec("demo", spec)
print(store.requests, flush=True)
"""


def operator(tmp_path: Path, who: str, state: str = STATE) -> dict[str, str]:
    """The environment of an operator: their own state directory and settings file, their login
    name, the shared state, 2 s leases."""
    home = tmp_path / who
    return {**os.environ, "GPUPROV_HOME": str(home / "state"), "GPUPROV_CONFIG": str(home / "settings.toml"),
            "USER": who, "LOGNAME": who, "GPUPROV_STATE": state, "GPUPROV_STATE_LEASE_S": "2"}


def gp(env: dict[str, str], *args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUPROV, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT)


@contextmanager
def holder(env: dict[str, str], said: list[str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """alice's `gpuprov provision demo` while it runs; what it said on stderr, once ended, in ``said``."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, "provision", "demo"], cwd=ROOT, text=True, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc
    finally:
        if proc.poll() is None:
            (said if said is not None else []).append(proc.communicate("\n", timeout=30)[1])


def _s3() -> Any:
    import boto3

    return boto3.client("s3", region_name=REGION)


def _alice_cluster(tmp_path: Path, front: Front) -> tuple[dict[str, str], dict[str, str], dict[str, bytes]]:
    """The bucket made by alice, and her cluster 'demo' made on her machine (local state) with its
    private files (an SSH private key, a munge key) then pushed: (alice's env, bob's, the secrets)."""
    alice, bob = operator(tmp_path, "alice"), operator(tmp_path, "bob")
    made = gp(alice, "state", "bucket", STATE)
    assert made.returncode == 0, made.stderr
    local = {**alice, "GPUPROV_STATE": "local"}
    code = ("import sys\nfrom gpuprov.state import Store, NodeRecord\n"
            "s = Store(); s.create_cluster('demo', 'static', {'count': 1, 'options': {}})\n"
            "s.replace_nodes('demo', [NodeRecord('demo-node-1', 'h1', '10.0.0.5', 22, 'admin', 'running')])\n")
    subprocess.run([sys.executable, "-c", code], env=local, check=True, cwd=ROOT)
    files = Path(alice["GPUPROV_HOME"]) / "clusters" / "demo"
    files.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(files / "id_ed25519")], check=True)
    (files / "munge.key").write_bytes(os.urandom(1024))
    public = " ".join((files / "id_ed25519.pub").read_text().split()[:2])  # a host key's line stands in
    (files / "known_hosts").write_text(f"[10.0.0.5]:22 {public}\n")
    secrets = {"ssh key": (files / "id_ed25519").read_bytes(), "munge key": (files / "munge.key").read_bytes()}
    pushed = gp(local, "state", "push", "demo", "--to", STATE)
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed to s3://team-state/fleet" in pushed.stderr
    return alice, bob, secrets


def test_two_operators_share_the_bucket_the_lock_and_nothing_secret(tmp_path: Path, front: Front) -> None:
    alice, bob, secrets = _alice_cluster(tmp_path, front)
    # Bob's list shows alice's cluster, and who changed it last.
    listed = gp(bob, "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in json.loads(listed.stdout) if r["name"] == "demo"]
    assert row["changed_by"].startswith("alice@") and row["state"] == "launching"
    # Bob's command while alice's runs: refused at once, naming alice's command.
    with holder(alice) as held:
        started = time.monotonic()
        refused = gp(bob, "settings", "demo", "--set", "root_free_gib=30")
        took = time.monotonic() - started
        assert refused.returncode == 1, refused.stderr
        assert re.fullmatch(rf"gpuprov: cluster 'demo' is busy: `gpuprov provision demo` \(pid {held.pid} of "
                            r"alice@\S+\) has held it since \S+Z, lease until \S+Z\n", refused.stderr), refused.stderr
        assert took < 2.0 + 1.5  # the command's own start-up (python, boto3) beside the refusal itself
        # Bob's provision too: it takes the lock before it reaches any node.
        provision = gp(bob, "provision", "demo")
        assert provision.returncode == 1 and provision.stderr.startswith(
            f"gpuprov: cluster 'demo' is busy: `gpuprov provision demo` (pid {held.pid} of alice@"), provision.stderr
    # Bob's change once alice's command ended; status says bob changed it.
    changed = gp(bob, "settings", "demo", "--set", "root_free_gib=30")
    assert changed.returncode == 0, changed.stderr
    # Alice's pinned host keys (public) came with her push; bob's locked command brought them to his.
    pinned = Path(bob["GPUPROV_HOME"]) / "clusters" / "demo" / "known_hosts"
    assert pinned.read_bytes() == (Path(alice["GPUPROV_HOME"]) / "clusters" / "demo" / "known_hosts").read_bytes()
    assert pinned.stat().st_mode & 0o777 == 0o600
    status = json.loads(gp(alice, "status", "demo", "-o", "json").stdout)
    assert status["changed_by"].startswith("bob@") and status["spec"]["options"]["settings"]["root_free_gib"]
    # Every S3 call the operators' commands made named this account as the bucket's owner, but
    # CreateBucket, which takes none (a name another account holds is refused: BucketAlreadyExists).
    assert front.unowned == [f"PUT /{BUCKET}"], front.unowned
    # No secret in any object, any version: raw, base64 or hex.
    s3 = _s3()
    bodies = [s3.get_object(Bucket=BUCKET, Key=v["Key"], VersionId=v["VersionId"])["Body"].read()
              for v in s3.list_object_versions(Bucket=BUCKET).get("Versions", [])]
    assert len(bodies) >= 4
    for what, secret in secrets.items():
        for form in (secret, base64.b64encode(secret), secret.hex().encode(), secret.hex().upper().encode()):
            for piece in (form[:48], form[-48:]):
                assert not any(piece in body for body in bodies), what
    assert not any(b"PRIVATE KEY" in body for body in bodies)


def test_a_dead_holders_lease_is_taken_over_and_a_live_one_broken_only_by_force(tmp_path: Path,
                                                                                 front: Front) -> None:
    alice, bob, _ = _alice_cluster(tmp_path, front)
    with holder(alice) as held:
        os.kill(held.pid, signal.SIGKILL)
        held.wait()
        # What the dead holder left: its lock, naming it, with a lease no one renews now.
        left = json.loads(_s3().get_object(Bucket=BUCKET, Key="fleet/locks/demo.json")["Body"].read())
        assert left["pid"] == held.pid and left["by"].startswith("alice@") and left["lease_s"] == 2
        time.sleep(max(0.0, left["until_s"] - time.time()) + 0.2)
        taken = gp(bob, "settings", "demo", "--set", "root_free_gib=31")
    assert taken.returncode == 0, taken.stderr
    assert re.search(rf"gpuprov: warning: took over the lock of cluster 'demo' from `gpuprov provision demo` "
                     rf"\(pid {held.pid} of alice@\S+\) has held it since \S+, lease until \S+: its lease ran out",
                     taken.stderr), taken.stderr
    said: list[str] = []
    with holder(alice, said) as live:
        asked = gp(bob, "unlock", "demo")
        assert asked.returncode == 1 and "--force" in asked.stderr and f"pid {live.pid}" in asked.stderr
        broke = gp(bob, "unlock", "demo", "--force")
        assert broke.returncode == 0, broke.stderr
        assert f"broke the live lock of `gpuprov provision demo` (pid {live.pid} of alice@" in broke.stderr
        time.sleep(1.2)  # the holder's next renewal (every third of the lease) finds it broken
        assert gp(bob, "settings", "demo", "--set", "root_free_gib=32").returncode == 0
    assert "this command's lock on cluster 'demo' was broken" in said[0], said
    assert gp(bob, "unlock", "demo").stderr.strip() == f"cluster 'demo' is not locked in {STATE}"


def test_two_hundred_alternating_updates_from_two_processes_lose_none(tmp_path: Path, front: Front) -> None:
    alice, bob, _ = _alice_cluster(tmp_path, front)
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, who, "100"], env=env, cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for who, env in (("alice", alice), ("bob", bob))]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    spec = json.loads(gp(bob, "status", "demo", "-o", "json").stdout)["spec"]
    assert sorted(k for k in spec if k.startswith(("alice-", "bob-"))) == sorted(
        [f"alice-{i:03d}" for i in range(100)] + [f"bob-{i:03d}" for i in range(100)])


def test_push_then_pull_round_trips_byte_for_byte_and_a_newer_side_is_kept(tmp_path: Path, front: Front) -> None:
    alice, bob, _ = _alice_cluster(tmp_path, front)
    code = ("import sys\nfrom gpuprov.state import Store, record_bytes, record_dict\n"
            "sys.stdout.buffer.write(record_bytes(record_dict(Store().get_cluster('demo'))))\n")

    def local_record(env: dict[str, str]) -> bytes:
        return subprocess.run([sys.executable, "-c", code], env={**env, "GPUPROV_STATE": "local"}, cwd=ROOT,
                              capture_output=True, check=True).stdout

    sent = local_record(alice)
    assert _s3().get_object(Bucket=BUCKET, Key="fleet/clusters/demo.json")["Body"].read() == sent
    pulled = gp({**bob, "GPUPROV_STATE": "local"}, "state", "pull", "demo", "--from", STATE)
    assert pulled.returncode == 0, pulled.stderr
    assert local_record(bob) == sent
    # Bob changes the shared record; alice's copy is now older: her push is refused, her pull takes it.
    time.sleep(1.1)  # records are stamped to the second
    assert gp(bob, "settings", "demo", "--set", "root_free_gib=33").returncode == 0
    older = gp({**alice, "GPUPROV_STATE": "local"}, "state", "push", "demo", "--to", STATE)
    assert older.returncode == 1 and "the record in s3://team-state/fleet is newer" in older.stderr, older.stderr
    assert local_record(alice) == sent  # alice's own record untouched
    assert gp({**alice, "GPUPROV_STATE": "local"}, "state", "pull", "demo", "--from", STATE).returncode == 0
    assert b'"root_free_gib"' in local_record(alice)
    # A local change after bob's makes alice's newer: bob's pull onto his own changed copy is refused.
    time.sleep(1.1)
    assert gp({**bob, "GPUPROV_STATE": "local"}, "settings", "demo", "--set", "root_free_gib=34").returncode == 0
    kept = gp({**bob, "GPUPROV_STATE": "local"}, "state", "pull", "demo", "--from", STATE)
    assert kept.returncode == 1 and "is newer" in kept.stderr, kept.stderr


def test_a_bucket_of_another_account_or_without_the_settings_is_refused(tmp_path: Path, front: Front) -> None:
    s3 = _s3()
    s3.create_bucket(Bucket="team-claimed")
    front.owners["team-claimed"] = OTHER
    claimed = operator(tmp_path, "alice", "s3://team-claimed/fleet")
    for args in (("list",), ("state", "bucket", "s3://team-claimed/fleet")):
        refused = gp(claimed, *args)
        assert refused.returncode == 2, refused.stderr
        assert f"S3 bucket team-claimed is not this account's ({iam.ACCOUNT})" in refused.stderr
    chosen = gp({**claimed, "GPUPROV_STATE": "local"}, "settings", "--set", "state=s3://team-claimed/fleet")
    assert chosen.returncode == 2 and "not this account's" in chosen.stderr
    assert not Path(claimed["GPUPROV_CONFIG"]).exists()  # nothing written
    s3.create_bucket(Bucket="team-plain")
    plain = gp(operator(tmp_path, "bob", "s3://team-plain/fleet"), "list")
    assert plain.returncode == 2
    assert ("S3 bucket team-plain is not fit for gpuprov's state: warning: Block Public Access is off"
            in plain.stderr) and "versioning is off" in plain.stderr and "TLS" in plain.stderr
    assert s3.list_objects_v2(Bucket="team-plain").get("KeyCount", 0) == 0


def test_a_bucket_is_made_with_a_named_kms_key(tmp_path: Path, front: Front) -> None:
    import boto3

    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["KeyId"]
    made = gp(operator(tmp_path, "alice"), "state", "bucket", STATE, "--kms-key", key)
    assert made.returncode == 0, made.stderr
    rule = _s3().get_bucket_encryption(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key}
    assert _s3().get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
    unknown = gp(operator(tmp_path, "bob"), "state", "bucket", "s3://team-other/fleet", "--kms-key",
                 "alias/nope")
    assert unknown.returncode == 2 and "--kms-key alias/nope: KMS says NotFoundException" in unknown.stderr
    assert "team-other" not in [b["Name"] for b in _s3().list_buckets()["Buckets"]]


def test_the_requests_each_state_operation_makes(tmp_path: Path, front: Front,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures of docs/team-state.md, held (benchmarks/state_s3.py prints them)."""
    import click

    from gpuprov import state_s3
    from gpuprov.cli.app import cli
    from gpuprov.cluster import cluster_lock
    from gpuprov.core import status
    from gpuprov.state import Store

    alice = operator(tmp_path, "alice")
    assert gp(alice, "state", "bucket", STATE).returncode == 0
    for key in ("GPUPROV_HOME", "GPUPROV_CONFIG", "GPUPROV_STATE", "USER", "LOGNAME"):
        monkeypatch.setenv(key, alice[key])
    monkeypatch.setattr(state_s3, "_CONNECTIONS", {})

    def sent(step: Any) -> int:
        before = sum(state_s3.SENT.values())
        step()
        return sum(state_s3.SENT.values()) - before

    store = Store()
    store.client()  # the connection, and the bucket's check made by `state bucket` from this directory: none
    assert sent(lambda: store.create_cluster("demo", "static", {"options": {}})) == 1
    assert sent(lambda: Store().get_cluster("demo")) == 1
    assert sent(lambda: store.set_spec("demo", {"options": {}, "x": 1})) == 1

    def locked() -> None:
        with click.Context(cli, info_name="gpuprov"), cluster_lock("demo"):
            pass

    assert sent(locked) == 3  # the lock put, the pinned host keys read (none), the lock deleted
    assert sent(lambda: status.change_settings("demo", {"root_free_gib": "30"})) == 6
    run: list[int] = []
    assert sent(lambda: run.append(Store().start_run("demo", "provision", None))) == 1
    assert sent(lambda: Store().finish_run(run[0], True, {})) == 2
    assert sent(lambda: Store().runs("demo", limit=5)) == 2
    for i in range(9):
        Store().create_cluster(f"more-{i}", "static", {})
    assert sent(lambda: Store().list_clusters()) == 11


def test_a_pushed_cluster_is_provisioned_by_a_granted_operator_with_his_own_key(tmp_path: Path, front: Front) -> None:
    """On a real local node: alice makes a cluster on her machine and pushes it to the team's
    bucket; bob, with his own state directory and his own key (granted by alice, applied by her
    next `provision`), provisions it and runs commands on it, with the host keys the bucket
    shared; once his key is revoked and that applied, his commands are refused."""
    alice, bob = operator(tmp_path, "alice"), operator(tmp_path, "bob")
    assert gp(alice, "state", "bucket", STATE).returncode == 0
    local = {**alice, "GPUPROV_STATE": "local"}
    name = f"team-{os.urandom(3).hex()}"
    try:
        made = gp(local, "up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap")
        assert made.returncode == 0, made.stderr
        pushed = gp(local, "state", "push", name, "--to", STATE)
        assert pushed.returncode == 0, pushed.stderr
        key = tmp_path / "bob" / "id_ed25519"
        key.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bob@laptop", "-f", str(key)], check=True)
        assert gp(bob, "settings", "--set", f"identity={key}").returncode == 0  # bob's own machine's setting
        assert gp(alice, "access", "grant", name, "--key", f"{key}.pub", "--as", "bob").returncode == 0
        applied = gp(alice, "provision", name, "--tags", "preflight", timeout=600)
        assert applied.returncode == 0, applied.stderr[-2000:]
        # Bob: no key of the cluster's on his machine; his own logs in, on the host keys alice pinned.
        assert not (Path(bob["GPUPROV_HOME"]) / "clusters" / name / "id_ed25519").exists()
        his = gp(bob, "provision", name, "--tags", "preflight", "-o", "json", timeout=600)
        assert his.returncode == 0, his.stderr[-2000:]
        assert json.loads(his.stdout)["ok"] is True
        ran = gp(bob, "exec", name, "--", "sh", "-c", "grep -c ' gpuprov-access:bob$' .ssh/authorized_keys")
        assert ran.returncode == 0 and ran.stdout.split() == [f"{name}-node-1", "|", "1"], ran.stderr
        assert not list((Path(bob["GPUPROV_HOME"]) / "clusters" / name).glob("id_ed25519*"))
        # Revoked, and applied by alice: bob is refused.
        assert gp(alice, "access", "revoke", name, "--as", "bob").returncode == 0
        applied = gp(alice, "provision", name, "--tags", "preflight", timeout=600)
        assert applied.returncode == 0, applied.stderr[-2000:]
        refused = gp(bob, "exec", name, "--", "true")
        assert refused.returncode != 0 and f"{name}-node-1" in refused.stderr, refused.stderr
        assert gp(alice, "exec", name, "--", "true").returncode == 0
    finally:
        gp(alice, "down", name, "--yes", timeout=300)
        subprocess.run(["docker", "rm", "-f", "-v", f"gpuprov-{name}-node-1"], capture_output=True, check=False)
