from __future__ import annotations

from pathlib import Path

from gpuprov import ssh


def test_pin_replaces_only_the_same_host_and_port(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("[127.0.0.1]:2201 ssh-ed25519 OLD1\nother.example ssh-ed25519 KEEP\n")
    ssh.pin_host_keys(kh, {("127.0.0.1", 2201): "ssh-ed25519 NEW1 root@n1",
                           ("127.0.0.1", 2202): "ssh-ed25519 NEW2"})
    lines = kh.read_text().splitlines()
    assert "[127.0.0.1]:2201 ssh-ed25519 NEW1" in lines
    assert "[127.0.0.1]:2202 ssh-ed25519 NEW2" in lines
    assert "other.example ssh-ed25519 KEEP" in lines
    assert not any("OLD1" in line for line in lines)
    assert kh.stat().st_mode & 0o777 == 0o600


def test_keypair_is_private_and_host_key_is_fresh(tmp_path: Path) -> None:
    key = ssh.ensure_keypair(tmp_path / "id_ed25519", "test")
    assert key.stat().st_mode & 0o777 == 0o600
    assert key.with_suffix(".pub").read_text().startswith("ssh-ed25519 ")
    _, pub1 = ssh.new_host_key(tmp_path, "a")
    _, pub2 = ssh.new_host_key(tmp_path, "b")
    assert pub1.split()[1] != pub2.split()[1]
    assert ssh.fingerprint(pub1).startswith("SHA256:")
