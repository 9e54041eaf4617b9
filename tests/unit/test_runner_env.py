"""What ansible-playbook is given: an allow-listed environment, host key checking forced on,
secrets only through memory files (trust review findings 1 and 7)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuprov.ansible.runner import SecretFiles, _is_memory_fs, runner_env


def test_environment_is_allow_listed_and_checks_host_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-aws")
    monkeypatch.setenv("GPUPROV_REGISTRY_PASSWORD", "canary-registry")
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o StrictHostKeyChecking=no")
    monkeypatch.setenv("GPUPROV_REGISTRY_MIRROR", "http://172.17.0.1:5000")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = runner_env({"ANSIBLE_CONFIG": "/x/ansible.cfg"})
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    assert "canary" not in repr(env)
    assert "ANSIBLE_SSH_ARGS" not in env
    assert env["ANSIBLE_CONFIG"] == "/x/ansible.cfg" and env["LANG"] == "C.UTF-8"
    # Settings reach the plays as the cluster's recorded values, never from the caller's shell.
    assert "GPUPROV_REGISTRY_MIRROR" not in env


def test_secret_file_lives_in_memory_for_the_run_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with SecretFiles({"base_images_registry_password_file": "s3cr3t"}) as files:
        path = Path(files["base_images_registry_password_file"])
        assert _is_memory_fs(str(path)) and (path.stat().st_mode & 0o777) == 0o600
        reads = []
        readers = [threading.Thread(target=lambda: reads.append(path.read_text())) for _ in range(3)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(5)
        assert reads == ["s3cr3t"] * 3
    assert not path.parent.exists()


def test_a_disk_directory_is_never_used_for_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # not a memory file system here
    if _is_memory_fs(str(tmp_path)):
        pytest.skip(f"{tmp_path} is itself on tmpfs on this machine")
    with SecretFiles({"v": "s3cr3t"}) as files:
        assert not files["v"].startswith(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_no_pipes_without_secrets() -> None:
    with SecretFiles({}) as pipes:
        assert pipes == {}
