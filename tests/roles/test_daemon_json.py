"""daemon.json is merged key by key, never clobbered; a broken one stops the run untouched.

The merge rules are the role's own filter (roles/container_runtime/filter_plugins),
tested here directly; the refusal runs the role for real on a local node.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, require_docker, run_cli
from tests.roles.nodeplay import inventory

_spec = importlib.util.spec_from_file_location(
    "daemon_json", ROOT / "roles/container_runtime/filter_plugins/daemon_json.py")
daemon_json = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(daemon_json)

ULIMITS = {"memlock": {"soft": -1, "hard": -1}, "stack": {"soft": 67108864, "hard": 67108864}}
USER = {
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m"},
    "data-root": "/srv/docker",
    "registry-mirrors": ["https://mirror.gpuprov.invalid"],
    "insecure-registries": ["registry.gpuprov.invalid:5000"],
    "runtimes": {"crun": {"path": "/usr/bin/crun"}},
    "default-ulimits": {"nofile": {"Name": "nofile", "Hard": 65536, "Soft": 65536}},
}


def merge(current, default=False, mirrors=(), insecure=()):
    return daemon_json.daemon_json_merge(current, "nvidia-container-runtime", default, ULIMITS,
                                         list(mirrors), list(insecure))


def test_user_keys_survive_and_nvidia_is_added() -> None:
    out = merge(USER, mirrors=["http://10.0.0.5:5000"], insecure=["10.0.0.5:5000"])
    for key in ("log-driver", "log-opts", "data-root"):
        assert out[key] == USER[key]
    assert out["runtimes"] == {"crun": {"path": "/usr/bin/crun"},
                               "nvidia": {"path": "nvidia-container-runtime"}}
    assert out["registry-mirrors"] == ["https://mirror.gpuprov.invalid", "http://10.0.0.5:5000"]
    assert out["insecure-registries"] == ["registry.gpuprov.invalid:5000", "10.0.0.5:5000"]
    assert set(out["default-ulimits"]) == {"nofile", "memlock", "stack"}
    assert out["default-ulimits"]["memlock"] == {"Name": "memlock", "Hard": -1, "Soft": -1}
    assert "default-runtime" not in out
    assert USER["runtimes"] == {"crun": {"path": "/usr/bin/crun"}}, "the input was modified"


def test_merge_is_stable_and_default_runtime_only_when_asked() -> None:
    once = merge(USER, mirrors=["http://10.0.0.5:5000"])
    assert merge(once, mirrors=["http://10.0.0.5:5000"]) == once
    assert merge(USER, default=True)["default-runtime"] == "nvidia"
    assert merge({**USER, "default-runtime": "crun"})["default-runtime"] == "crun"


def test_user_settings_of_the_nvidia_runtime_are_kept() -> None:
    out = merge({"runtimes": {"nvidia": {"path": "/old/path", "runtimeArgs": ["--debug"]}}})
    assert out["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "runtimeArgs": ["--debug"]}


def test_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError):
        merge(["not", "an", "object"])


def test_ulimits_lowered_only_where_the_node_cannot_raise_them() -> None:
    limits = daemon_json.proc_limits(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max stack size            8388608              unlimited            bytes\n"
        "Max locked memory         8388608              8388608              bytes\n")
    assert limits == {"stack": -1, "memlock": 8388608}
    assert not daemon_json.can_raise_limits("CapBnd: 000001fffeffffff\n")  # docker --cap-drop SYS_RESOURCE
    assert daemon_json.can_raise_limits("CapBnd: 000001ffffffffff\n")
    assert daemon_json.ulimits_within(ULIMITS, limits) == {
        "memlock": {"soft": 8388608, "hard": 8388608},
        "stack": {"soft": 67108864, "hard": 67108864}}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    require_docker()
    import os

    home = tmp_path_factory.mktemp("gpuprov-home")
    env = {**os.environ, "GPUPROV_HOME": str(home), "ANSIBLE_NOCOLOR": "1"}
    name = f"djson-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap", "--no-baked",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)
    yield env, name, home / "clusters" / name
    run_cli("down", name, "--yes", env=env)


def _sh(name: str, cmd: str) -> subprocess.CompletedProcess[str]:
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={name}-node-1"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return subprocess.run(["docker", "exec", cid, "sh", "-c", cmd], capture_output=True, text=True,
                          check=False)


def test_broken_daemon_json_stops_the_run_untouched(node, tmp_path) -> None:
    env, name, cdir = node
    broken = '{\n  "log-driver": "json-file",\n  "data-root": "/srv/docker"\n  "debug": true\n}\n'
    _sh(name, f"mkdir -p /etc/docker && printf '%s' '{broken}' > /etc/docker/daemon.json")
    before = _sh(name, "sha256sum /etc/docker/daemon.json; stat -c %Y /etc/docker/daemon.json").stdout
    play_env = {**env, "ANSIBLE_CONFIG": str(cdir / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "json",
                "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    # gpuprov_base (every play's first role, container_runtime's dependency) has run on the
    # node before, as on any bootstrapped node: what follows is container_runtime's doing.
    base = tmp_path / "base.yml"
    base.write_text(yaml.safe_dump([{"name": "base", "hosts": "all", "become": True,
                                     "gather_facts": True, "roles": [{"role": "gpuprov_base"}]}]))
    subprocess.run([playbook, "-i", str(inventory(cdir)), str(base)], capture_output=True, text=True,
                   check=True, env=play_env)
    book = tmp_path / "play.yml"
    book.write_text(yaml.safe_dump([{"name": "containers", "hosts": "all", "become": True,
                                     "gather_facts": True, "roles": [{"role": "container_runtime"}]}]))
    proc = subprocess.run([playbook, "-i", str(inventory(cdir)), str(book)],
                          capture_output=True, text=True, check=False, env=play_env)
    assert proc.returncode != 0, "a broken daemon.json must stop the run"
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    failed = [res.get("msg", "") for p in data["plays"] for t in p["tasks"]
              for res in t["hosts"].values() if res.get("failed")]
    assert len(failed) == 1 and "/etc/docker/daemon.json is not valid JSON" in failed[0], failed
    assert "line 4" in failed[0] and "gpuprov left it untouched" in failed[0], failed[0]
    assert next(iter(data["stats"].values()))["changed"] == 0
    assert _sh(name, "sha256sum /etc/docker/daemon.json; stat -c %Y /etc/docker/daemon.json").stdout == before
    assert _sh(name, "command -v dockerd").returncode != 0, "nothing may be installed before the refusal"
