"""The operator's own key (gpuprov.identity): which key gpuprov's connections log in with, how
it is named (`settings --set identity=PATH`, GPUPROV_IDENTITY), what is refused; and the
operators' keys applied to an authorized_keys file as a play applies them (gpuprov.ssh
.with_access: the nodes Slurm boots from an image)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpuprov import identity, ssh
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from tests.conftest import invoke

ALICE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKk0cFf0sVhM0W7mTHwWmRRm5r9e0cI4M3sHk5m4x1Yb gpuprov-access:alice"
BOB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv0m3rj2l0s8y1N1a8G6iVjzq0q0Jv6vY6c1lA4Yc7Q gpuprov-access:bob"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "config" / "settings.toml"
    monkeypatch.setenv("GPUPROV_CONFIG", str(path))
    monkeypatch.delenv(identity.ENV, raising=False)
    return path


@pytest.fixture
def bob_key(tmp_path: Path) -> Path:
    key = tmp_path / "keys" / "bob_ed25519"
    key.parent.mkdir()
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n(a test's stand-in)\n")
    key.with_suffix(".pub").write_text(BOB + "\n")
    return key


def test_the_clusters_own_key_wins_where_this_machine_holds_it(tmp_path, config, bob_key, monkeypatch) -> None:
    files = ClusterFiles(tmp_path / "clusters" / "c1")
    files.dir.mkdir(parents=True)
    monkeypatch.setenv(identity.ENV, str(bob_key))
    assert files.login_key == bob_key  # not the maker: the cluster's key is not here
    files.key.write_text("the maker's key")
    assert files.login_key == files.key
    files.key.unlink()
    monkeypatch.delenv(identity.ENV)
    assert files.login_key == files.key  # neither: the cluster's path, whose absence SSH names


def test_the_settings_file_names_it_and_the_environment_wins(config, bob_key, tmp_path, monkeypatch) -> None:
    config.parent.mkdir(parents=True)
    config.write_text(f'identity = "{bob_key}"\nartifact_mirror = "http://10.0.0.1:8080/"\n')
    assert identity.chosen() == bob_key
    other = tmp_path / "keys" / "other"
    other.write_text("x")
    monkeypatch.setenv(identity.ENV, str(other))
    assert identity.chosen() == other
    monkeypatch.setenv(identity.ENV, "")
    assert identity.chosen() is None


@pytest.mark.parametrize(("value", "words"), [
    ("keys/bob", "give the absolute path"),
    ("/tmp/a b", "give the absolute path"),
    ("/tmp/{{ lookup('pipe', 'id') }}", "give the absolute path"),
    ("/tmp/%h", "give the absolute path"),
    ("/tmp/../etc/shadow", "give the absolute path"),
    ("/nonexistent/key", "no such file"),
])
def test_a_path_that_would_become_syntax_or_names_nothing_is_refused(config, value, words) -> None:
    with pytest.raises(BadInput, match=words):
        identity.parse(value, "--set identity=")


def test_a_public_key_is_refused_naming_its_private_half(config, bob_key) -> None:
    with pytest.raises(BadInput, match="that is a public key"):
        identity.parse(f"{bob_key}.pub", "--set identity=")


def test_settings_set_identity_writes_it_and_bad_input_writes_nothing(config, bob_key, capsys) -> None:
    code, _, err = invoke(capsys, "settings", "--set", f"identity={bob_key}")
    assert code == 0, err
    assert tomllib.loads(config.read_text()) == {"identity": str(bob_key)}
    before = config.read_text()
    for bad in ("identity=relative/key", "identity=/nonexistent/key", "identity=/tmp/x y"):
        code, _, err = invoke(capsys, "settings", "--set", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
    # a bad state beside a good identity: neither is written
    code, _, err = invoke(capsys, "settings", "--set", f"identity={bob_key}", "--set", "state=ftp://x")
    assert code == 2 and "expected local or s3://" in err, err
    assert config.read_text() == before
    code, _, err = invoke(capsys, "settings", "--set", "identity=")
    assert code == 0 and tomllib.loads(config.read_text()) == {}, err


def test_a_settings_file_naming_an_identity_still_gives_clusters_their_settings(config, bob_key) -> None:
    from gpuprov import settings

    config.parent.mkdir(parents=True)
    config.write_text(f'identity = "{bob_key}"\nartifact_mirror = "http://10.0.0.1:8080/"\n')
    found, _ = settings._file()
    assert found == {"artifact_mirror": "http://10.0.0.1:8080/"}


def test_granted_keys_go_in_revoked_ones_out_and_no_other_line_moves() -> None:
    cluster = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB2lXq3YQ7o7l0uQm3m1Yd9e3r0p5Kx3a6o2WwqJ7v1t gpuprov-c1"
    site = 'from="10.0.0.0/8" ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 ops@site'
    old_bob = BOB.replace("gpuprov-access:bob", "bob@old-laptop")
    text = f"{cluster}\n{site}\n{old_bob}\n"
    entries = [{"name": "alice", "key": ALICE, "state": "present"},
               {"name": "bob", "key": BOB, "state": "absent"}]
    assert ssh.with_access(text, entries) == f"{cluster}\n{site}\n{ALICE}\n"
    # present where the blob is already there: that line takes the recorded form, in place
    assert ssh.with_access(text, [{"name": "bob", "key": BOB, "state": "present"}]) == f"{cluster}\n{site}\n{BOB}\n"
    # applied twice, the same
    once = ssh.with_access(text, entries)
    assert ssh.with_access(once, entries) == once
    assert ssh.with_access("", []) == "" and ssh.with_access(text, []) == text
