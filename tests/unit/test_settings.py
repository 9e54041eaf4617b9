"""Cluster settings live with the cluster: recorded at creation from the environment or the
settings file, reused by every later command, changed only on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import settings
from gpuprov.core import status
from gpuprov.errors import BadInput
from gpuprov.state import Store

ENV = [env for env, _ in settings.SETTINGS.values()]


@pytest.fixture
def clean(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    return gpuprov_home


def _cluster(name: str = "c1") -> Store:
    store = Store()
    store.create_cluster(name, "docker", {"options": {"settings": settings.for_new_cluster()}})
    return store


def test_environment_wins_over_the_settings_file(clean, tmp_path, monkeypatch) -> None:
    path = Path(settings.config_path())
    settings_file = tmp_path / "settings.toml"
    monkeypatch.setenv("GPUPROV_CONFIG", str(settings_file))
    monkeypatch.setenv("GPUPROV_ARTIFACT_MIRROR", "http://10.0.0.5:8089")
    monkeypatch.setenv("GPUPROV_REGISTRY_MIRROR", "http://10.0.0.5:5000")
    assert settings.write_file() == settings_file and path != settings_file
    monkeypatch.delenv("GPUPROV_REGISTRY_MIRROR")
    monkeypatch.setenv("GPUPROV_ARTIFACT_MIRROR", "http://10.0.0.6:8089")
    got = settings.for_new_cluster()
    assert got["artifact_mirror"] == {"value": "http://10.0.0.6:8089",
                                      "from": "environment (GPUPROV_ARTIFACT_MIRROR)"}
    assert got["registry_mirror"] == {"value": "http://10.0.0.5:5000", "from": str(settings_file)}


def test_later_commands_use_what_the_cluster_recorded(clean, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_ARTIFACT_MIRROR", "http://10.0.0.5:8089")
    store = _cluster()
    monkeypatch.delenv("GPUPROV_ARTIFACT_MIRROR")  # another shell, a colleague
    pvars = settings.playbook_vars(store.get_cluster("c1"), {"hash": "x"})
    assert pvars["gpuprov_artifact_mirror"] == "http://10.0.0.5:8089"
    assert pvars["gpuprov_registry_mirror"] == "" and pvars["gpuprov_registry_digests"] == {}


def test_a_different_value_is_refused_with_the_way_to_change_it(clean, monkeypatch) -> None:
    monkeypatch.setenv("GPUPROV_ARTIFACT_MIRROR", "http://10.0.0.5:8089")
    store = _cluster()
    monkeypatch.setenv("GPUPROV_ARTIFACT_MIRROR", "http://10.9.9.9:8089")
    with pytest.raises(BadInput, match=r"differs from cluster 'c1''s artifact_mirror .*"
                                       r"gpuprov settings c1 --set artifact_mirror=VALUE"):
        settings.playbook_vars(store.get_cluster("c1"), {})
    out = status.change_settings("c1", {"artifact_mirror": "http://10.9.9.9:8089"})
    assert out.changed == ["artifact_mirror"]
    assert settings.playbook_vars(store.get_cluster("c1"), {})["gpuprov_artifact_mirror"] == \
        "http://10.9.9.9:8089"
    assert status.status("c1").settings["artifact_mirror"].from_ == "gpuprov settings --set"


@pytest.mark.parametrize("key,value", [
    ("artifact_mirror", "http://x/\nDeb: evil"), ("registry_mirror", "ftp://10.0.0.1/"),
    ("container_toolkit_repo_fpr", "ABCD"), ("registry_digests", "[1]"),
    ("registry_digests", '{"a": "md5:0"}'), ("nonsense", "http://x/"),
    ("apt_proxy", "http://user:pw@proxy:3142"), ("root_free_gib", "-1"), ("root_free_gib", "40 GiB"),
    ("root_free_gib", "{{ 0 }}"),
])
def test_bad_values_are_bad_input_and_change_nothing(clean, key, value) -> None:
    store = _cluster()
    before = store.get_cluster("c1").spec
    with pytest.raises(BadInput):
        status.change_settings("c1", {key: value})
    assert store.get_cluster("c1").spec == before


def test_a_broken_settings_file_is_named(clean, tmp_path, monkeypatch) -> None:
    bad = tmp_path / "settings.toml"
    bad.write_text('artifact_mirror = "http://x\n')
    monkeypatch.setenv("GPUPROV_CONFIG", str(bad))
    with pytest.raises(BadInput, match=f"settings file {bad} is not valid TOML"):
        settings.for_new_cluster()


def test_a_clusters_free_space_floor_reaches_every_play_only_when_recorded(clean, monkeypatch) -> None:
    """Unset, the plays get no floor of the cluster's (the role's 40 GiB, the local nodes' 20, a
    host's own); recorded, every node of the cluster is asked that much, whoever runs the play."""
    store = _cluster("c1")
    assert "gpu_preflight_root_free_gib" not in settings.playbook_vars(store.get_cluster("c1"), {})
    monkeypatch.setenv("GPUPROV_ROOT_FREE_GIB", "25")
    store = _cluster("c2")
    monkeypatch.delenv("GPUPROV_ROOT_FREE_GIB")
    assert settings.playbook_vars(store.get_cluster("c2"), {})["gpu_preflight_root_free_gib"] == 25
    status.change_settings("c2", {"root_free_gib": "0"})
    assert settings.playbook_vars(store.get_cluster("c2"), {})["gpu_preflight_root_free_gib"] == 0
