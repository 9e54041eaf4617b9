"""Each operator's own key on a cluster (gpuprov.core.access, issue 57): a key file is one public
key line and nothing else, a name a lowercase name; grants are recorded in the cluster's record,
listed and revoked, under the cluster lock. And the S3 state's merge of a change onto a record
another writer changed (gpuprov.state_s3.merge), and who changed a record last (both stores)."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
from pathlib import Path

import pytest

from gpuprov import settings
from gpuprov.core import access
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.state import LocalStore, Store, record_bytes, record_dict, record_of
from gpuprov.state_s3 import merge
from tests.conftest import invoke


def _keypair(tmp_path: Path, kind: str = "ed25519", bits: str = "") -> Path:
    path = tmp_path / f"id_{kind}{bits}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *(["-b", bits] if bits else []), "-N", "", "-C", "bob@laptop",
                    "-f", str(path)], check=True)
    return path.with_suffix(".pub")


def _wire(*parts: bytes) -> str:
    return base64.b64encode(b"".join(struct.pack(">I", len(p)) + p for p in parts)).decode()


@pytest.mark.parametrize("kind", ["ed25519", "ecdsa", "rsa"])
def test_a_public_key_line_is_taken_without_its_comment(tmp_path: Path, kind: str) -> None:
    pub = _keypair(tmp_path, kind)
    line = access.public_key(pub)
    assert line == " ".join(pub.read_text().split()[:2]) and "bob@laptop" not in line


@pytest.mark.parametrize(("text", "why"), [
    ('command="sh" ssh-ed25519 {blob}', "no options such as command="),
    ("from=\"*\" ssh-ed25519 {blob} x", "no options such as command="),
    ("ssh-ed25519 {blob}\nssh-ed25519 {blob}", "expected one public key line, found 2"),
    ("ssh-dss {blob}", "TYPE one of"),
    ("ssh-ed25519 not!base64", "not base64"),
    ("ssh-ed25519 {rsa_blob}", "of type b'ssh-rsa', not ssh-ed25519"),
    ("ssh-rsa {small_rsa}", "fewer than 2048 bits"),
    ("ssh-ed25519 {blob} a comment with words", "expected TYPE BASE64 [COMMENT]"),
    ("", "expected one public key line, found 0"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----", "never the private key"),
    ("ssh-ed25519 {blob} caf\u00e9", "not ASCII"),
])
def test_anything_but_one_public_key_line_is_refused(tmp_path: Path, text: str, why: str) -> None:
    blob = _wire(b"ssh-ed25519", b"k" * 32)
    path = tmp_path / "key.pub"
    path.write_text(text.format(blob=blob, rsa_blob=_wire(b"ssh-rsa", b"\x01\x00\x01", b"\x80" * 256),
                                small_rsa=_wire(b"ssh-rsa", b"\x01\x00\x01", b"\x80" * 128)))
    with pytest.raises(BadInput) as refused:
        access.public_key(path)
    assert why in str(refused.value)


@pytest.mark.parametrize("name", ["", "Bob", "bob smith", "-bob", "bob;rm", "b" * 33, "bob\n", 'bob"'])
def test_a_grant_name_is_a_lowercase_name(name: str) -> None:
    with pytest.raises(BadInput):
        access.grant_name(name)


def test_grant_list_revoke_through_the_cli(capsys: pytest.CaptureFixture[str], gpuprov_home: Path,
                                           tmp_path: Path) -> None:
    Store().create_cluster("demo", "static", {"options": {}})
    pub = _keypair(tmp_path)
    code, out, _ = invoke(capsys, "access", "grant", "demo", "--key", str(pub), "--as", "bob")
    assert code == 0 and out.startswith("demo: granted bob (SHA256:") and "`gpuprov provision demo` puts it" in out
    code, out, _ = invoke(capsys, "access", "list", "demo")
    assert code == 0 and out.startswith("bob\tSHA256:") and "granted by" in out
    record = Store().get_cluster("demo")
    assert record is not None and record.spec["access"]["bob"]["key"].endswith(" gpuprov-access:bob")
    assert record.changed_by and record.changed_at
    # What the next provision hands the preflight play: the key present.
    key = record.spec["access"]["bob"]["key"]
    assert settings.access_keys(record) == [{"name": "bob", "key": key, "state": "present"}]
    code, out, _ = invoke(capsys, "access", "revoke", "demo", "--as", "bob")
    assert (code, out) == (0, "demo: revoked bob; `gpuprov provision demo` takes the key off the nodes\n")
    code, out, _ = invoke(capsys, "access", "revoke", "demo", "--as", "bob")
    assert (code, out) == (0, "demo: bob had no grant\n")
    revoked = Store().get_cluster("demo")
    assert revoked is not None and settings.access_keys(revoked) == [{"name": "bob", "key": key, "state": "absent"}]
    code, out, _ = invoke(capsys, "access", "list", "demo")
    assert "\trevoked by " in out
    # Bob's new key: granted again; the old one is taken off the nodes by the next provision.
    assert invoke(capsys, "access", "grant", "demo", "--key", str(_keypair(tmp_path, "ecdsa")), "--as", "bob")[0] == 0
    regranted = Store().get_cluster("demo")
    assert regranted is not None
    new = regranted.spec["access"]["bob"]["key"]
    assert settings.access_keys(regranted) == [{"name": "bob", "key": key, "state": "absent"},
                                               {"name": "bob", "key": new, "state": "present"}]
    code, _, err = invoke(capsys, "access", "grant", "demo", "--key", str(pub))
    assert code == 2 and err == "gpuprov: gpuprov access grant NAME: --key FILE and --as NAME are both needed\n"
    code, _, err = invoke(capsys, "access", "grant", "demo", "--key", str(pub.with_suffix("")), "--as", "bob")
    assert code == 2 and "never the private key" in err
    after = Store().get_cluster("demo")
    assert after is not None and after.spec["access"]["bob"]["key"] == new  # the refused grant changed nothing


def test_unlock_with_the_local_state_breaks_nothing(capsys: pytest.CaptureFixture[str], gpuprov_home: Path) -> None:
    code, _, err = invoke(capsys, "unlock", "demo", "--force")
    assert code == 1 and "locks with the kernel (flock)" in err


def test_a_bad_state_location_is_refused_in_one_line(capsys: pytest.CaptureFixture[str], gpuprov_home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for value, why in (("gs://b/p", "expected local or s3://BUCKET/PREFIX"),
                       ("s3://Bad_Bucket/p", "is not an S3 bucket name"),
                       ("s3://team-state", "the prefix must be"), ("s3://team-state/a/../b", "the prefix must be")):
        monkeypatch.setenv("GPUPROV_STATE", value)
        code, _, err = invoke(capsys, "list")
        assert code == 2 and why in err and err.count("\n") == 1, err
    monkeypatch.delenv("GPUPROV_STATE")
    code, _, err = invoke(capsys, "settings", "--set", "state=ftp://x")
    assert code == 2 and "expected local or s3://BUCKET/PREFIX" in err
    code, _, err = invoke(capsys, "settings", "--set", "root_free_gib=3")
    assert code == 2 and "give a cluster's NAME" in err


def test_a_change_is_merged_onto_another_writers_field_by_field() -> None:
    base = {"name": "demo", "state": "launched", "spec": {"a": 1, "b": 2}, "lock": None}
    ours = {**base, "spec": {"a": 1, "b": 2, "mine": 3}, "state": "bootstrapped"}
    theirs = {**base, "spec": {"a": 9, "b": 2, "theirs": 4}, "lock": {"hash": "x"}, "changed_by": "alice@a"}
    assert merge(base, ours, theirs) == {"name": "demo", "state": "bootstrapped", "lock": {"hash": "x"},
                                         "spec": {"a": 9, "b": 2, "mine": 3, "theirs": 4}, "changed_by": "alice@a"}
    # A key we removed stays removed; one both changed alike is no conflict.
    assert merge(base, {**base, "spec": {"a": 1}}, {**base, "spec": {"a": 1, "b": 2, "c": 5}})["spec"] == {"a": 1, "c": 5}
    assert merge(base, {**base, "state": "verified"}, {**base, "state": "verified"})["state"] == "verified"
    with pytest.raises(GpuprovError) as conflict:
        merge(base, {**base, "spec": {"a": 2, "b": 2}}, {**theirs, "changed_at": "2026-12-06T22:00:00Z"})
    assert str(conflict.value).startswith("cluster 'demo': spec.a was changed by alice@a at 2026-12-06T22:00:00Z "
                                          "while this command changed it too; nothing written")


def test_a_record_round_trips_through_its_document_and_says_who_changed_it(gpuprov_home: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "carol")
    monkeypatch.setenv("LOGNAME", "carol")
    store = Store()
    store.create_cluster("demo", "static", {"options": {}, "count": 2})
    store.set_cluster_state("demo", "reachable")
    record = store.get_cluster("demo")
    assert record is not None and record.changed_by is not None and record.changed_by.startswith("carol@")
    document = record_bytes(record_dict(record))
    assert record_of(json.loads(document)) == record
    other = LocalStore(gpuprov_home / "other.db")
    other.import_record(record)
    assert record_bytes(record_dict(other.get_cluster("demo"))) == document  # type: ignore[arg-type]
