"""A setting is data, never a template (issue 30, item 1).

ansible-core takes the extra variables of ``-e @file`` as trusted template source: a value
holding ``{{ lookup('pipe', ...) }}`` would run a command on the controller (push) or as root
on the node (pull). Here: a template in a setting, an environment variable or ``--mirror-url``
is refused at the door (one line, exit 2, nothing created); one smuggled into a cluster's
stored record (written straight into the state store, as an attacker with write access to it
or an older gpuprov would) reaches the play literally and runs nothing, through the real
ansible-playbook that push runs (gpuprov.ansible.runner.run_playbook) and the one the pull
agent runs on a node (its converge(), on the bundle's variables file).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprov import settings
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.state import Store
from tests.conftest import run_cli

SETTING_ENVS = [env for env, _ in settings.SETTINGS.values()]


def _evil(marker: Path) -> str:
    """A template that would leave ``marker`` behind if Ansible ever evaluated it."""
    return f"{{{{ lookup('pipe', 'touch {marker}') }}}}"


# The example: no space in it (a URL with spaces was refused already).
TEMPLATE = "{{lookup('pipe','id')}}"


def _cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A state directory of its own, no setting from this shell, and FIXTURE: an engine address
    where none listens, so that a refusal that does not come can create no container."""
    env = {k: v for k, v in os.environ.items() if k not in SETTING_ENVS}
    return {**env, "GPUPROV_HOME": str(tmp_path / "home"), "GPUPROV_CONFIG": str(tmp_path / "none.toml"),
            "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock", **extra}


def _refused_and_nothing_made(proc: Any, tmp_path: Path, name: str, says: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert "{{" in lines[0]  # the value is named as given
    listed = run_cli("list", "-o", "json", env=_cli_env(tmp_path))
    assert name not in listed.stdout, listed.stdout
    assert not (tmp_path / "home" / "clusters" / name).exists()


# -- at the door: refused, one line, exit 2, nothing created -------------------------------------
def test_a_template_in_the_settings_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(f"artifact_mirror = {json.dumps('http://m.example/' + TEMPLATE)}\n")
    name = f"tpl-{secrets.token_hex(3)}"
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--no-bootstrap", "--name", name,
                   env=_cli_env(tmp_path, GPUPROV_CONFIG=str(config)), timeout=120)
    _refused_and_nothing_made(proc, tmp_path, name, "artifact_mirror")


def test_a_template_in_the_environment_is_refused(tmp_path: Path) -> None:
    name = f"tpl-{secrets.token_hex(3)}"
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--no-bootstrap", "--name", name,
                   env=_cli_env(tmp_path, GPUPROV_REGISTRY_MIRROR="http://m.example:5000/" + TEMPLATE),
                   timeout=120)
    _refused_and_nothing_made(proc, tmp_path, name, "GPUPROV_REGISTRY_MIRROR")


def test_a_template_in_mirror_url_is_refused(tmp_path: Path) -> None:
    name = f"tpl-{secrets.token_hex(3)}"
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--no-bootstrap", "--name", name,
                   "--source", "mirror", "--mirror-url", "http://m.example/" + TEMPLATE,
                   "--mirror-key-fingerprint", "6825B41D53B930A5B16B78A4A0202F7C261412E1",
                   env=_cli_env(tmp_path), timeout=120)
    _refused_and_nothing_made(proc, tmp_path, name, "--mirror-url")


HEX = "28ffc0ebd675d612b47175f76164d4f865611020a178efc23b0a5c45e14770be"


@pytest.mark.parametrize("key,value", [
    ("artifact_mirror", "http://m.example/" + TEMPLATE),
    ("container_toolkit_repo", "http://m.example/{%if(true)%}x{%endif%}/"),
    ("registry_mirror", "http://m.example:5000/{#"),
    ("apt_proxy", "http://proxy:3142/%7B%7B"),
    ("apt_proxy", "http://proxy:3142/#"),
    ("registry_digests", json.dumps({"nvidia/cuda:11.8": "sha256:" + TEMPLATE})),
    ("registry_digests", json.dumps({"nvidia/cuda:11.8": "sha256:" + HEX.upper()})),
    ("registry_digests", json.dumps({"nvidia/cuda:11.8": "sha256:" + HEX[:-1]})),
    ("registry_digests", json.dumps({"nvidia/cuda:11.8": "sha256:" + HEX + "\n"})),
    ("registry_digests", json.dumps({TEMPLATE: "sha256:" + HEX})),
])
def test_validators_refuse_templates_and_loose_digests(key: str, value: str) -> None:
    with pytest.raises(BadInput) as refused:
        settings.check(key, value, "test")
    assert "\n" not in str(refused.value)


def test_validators_keep_what_is_valid() -> None:
    digests = {"nvidia/cuda:11.8.0-cudnn8-devel-ubuntu22.04": "sha256:" + HEX,
               "172.17.0.1:5000/nvidia/cuda:11.8.0-runtime": "sha256:" + HEX}
    assert json.loads(settings.check("registry_digests", json.dumps(digests), "test")) == digests
    assert settings.check("apt_proxy", "http://172.17.0.1:3142", "test") == "http://172.17.0.1:3142"
    assert settings.check("container_toolkit_repo", "https://m.example/a_b-c.d/~x/", "t") == \
        "https://m.example/a_b-c.d/~x/"


# -- smuggled into the record: passed through literally, nothing runs ----------------------------
@pytest.fixture
def clean(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No setting from this shell (the record is what the plays get)."""
    for var in SETTING_ENVS:
        monkeypatch.delenv(var, raising=False)
    return gpuprov_home


def _smuggled_vars(tmp_path: Path, marker: Path) -> dict[str, Any]:
    """The play variables gpuprov builds (settings.playbook_vars) for a cluster whose record
    carries a template in a setting, in --mirror-url and in the lock, written straight into
    the state store (no validator saw them)."""
    evil = _evil(marker)
    spec = {"options": {"mirror_url": f"http://m.example/{evil}/",
                        "settings": {"artifact_mirror": {"value": f"http://m.example/{evil}", "from": "x"}}}}
    lock = {"hash": "abc123", "microcode": {"intel": f"3.2025{evil}", "amd": f"3.2025{evil}"},
            "packages": {"cuda": "cuda-toolkit{% if lookup('pipe', 'touch " + str(marker) + "') %}{% endif %}"}}
    store = Store()
    store.create_cluster("smuggled", "docker", spec, lock)
    return settings.playbook_vars(store.get_cluster("smuggled"), lock)


# The play: each value written to a file as it arrived; one taken through a play variable and a
# set_fact, as roles/gpuprov_lock/vars/main.yml and the roles take them. A secret's file is read as the
# plays read one (lookup('file', var)).
PLAY = """\
- hosts: all
  gather_facts: false
  vars:
    through_play_var: "{{ gpuprov_stack.microcode.intel | trim }}"
  tasks:
    - ansible.builtin.set_fact:
        through_set_fact: "{{ through_play_var if through_play_var | length > 0 else '' }}"
    - ansible.builtin.copy:
        dest: "%(out)s"
        mode: "0600"
        content: |
          {{ gpuprov_artifact_mirror }}
          {{ gpuprov_mirror_url }}
          {{ gpuprov_stack.packages.cuda }}
          {{ through_set_fact }}
          {{ lookup('ansible.builtin.file', secret_var | default('/dev/null')) }}
          end
"""


def _expected(extravars: dict[str, Any], secret: str = "") -> str:
    return "\n".join([extravars["gpuprov_artifact_mirror"], extravars["gpuprov_mirror_url"],
                      extravars["gpuprov_stack"]["packages"]["cuda"],
                      extravars["gpuprov_stack"]["microcode"]["intel"], secret, "end"]) + "\n"


def test_run_playbook_hands_every_extra_var_over_as_data(clean: Path, tmp_path: Path) -> None:
    """Push: the real ansible-playbook, through run_playbook, against this machine (a local
    connection instead of SSH: the variables are what is tested)."""
    from gpuprov.ansible.runner import run_playbook

    marker = tmp_path / "pwned-push"
    extravars = _smuggled_vars(tmp_path, marker)
    secret = "s3cr3t {{ lookup('pipe', 'touch " + str(marker) + "') }}"
    files = ClusterFiles(tmp_path / "cluster")
    files.dir.mkdir()
    files.inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    files.ansible_cfg.write_text("[defaults]\nretry_files_enabled = False\n")
    out = tmp_path / "arrived.txt"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY % {"out": out})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = run_playbook(playbook, files, ["localhost"], run_dir, title="data", extravars=extravars,
                          secrets={"secret_var": secret})
    assert result.ok, (result.errors, (result.artifact_dir / "stdout").read_text()[-3000:])
    assert out.read_text() == _expected(extravars, secret)
    assert "{{ lookup('pipe', 'touch" in out.read_text()
    assert not marker.exists()
    # handed over as gpuprov's own tagged file (owner only), never as ansible-runner's
    vars_file = run_dir / "extravars.yml"
    assert vars_file.stat().st_mode & 0o777 == 0o600 and "!unsafe" in vars_file.read_text()
    assert not (run_dir / "env" / "extravars").exists()


def _agent():
    from gpuprov.pull import bundle as bundle_mod

    spec = importlib.util.spec_from_file_location("gpuprov_pull_agent", bundle_mod.NODE_DIR / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pull_bundle_vars_reach_the_nodes_play_as_data(clean: Path, tmp_path: Path) -> None:
    """Pull: the real bundle, unpacked by the real agent and run by its converge() with the
    bundle's own ansible-core over a local connection. FIXTURE: the bundle's site.yml is
    replaced by the one-task play above (the whole site is tests/e2e/test_pull_e2e.py's)."""
    from gpuprov.pull import bundle as bundle_mod

    marker = tmp_path / "pwned-pull"
    extravars = _smuggled_vars(tmp_path, marker)
    bundle = bundle_mod.build(lock=extravars["gpuprov_stack"], extravars=extravars, group="gpuprov_nodes",
                              group_vars={"gpuprov_cluster": "smuggled"},
                              profiles={"p": {"hostvars": {"ansible_python_interpreter": sys.executable},
                                              "expect": {}}})
    agent = _agent()
    root = tmp_path / "unpacked"
    manifest = agent.unpack(bundle.data, root)
    config = {"node": "n1", "profile": "p"}
    agent.inventory(root, config)
    out = tmp_path / "arrived.txt"
    (root / "site" / "playbooks" / "site.yml").write_text(PLAY % {"out": out})
    log, events = tmp_path / "pull.log", tmp_path / "events.jsonl"
    env = agent.environment(root, events, config)
    rc = agent.converge(root, manifest, env, log)
    assert rc == 0, log.read_text()[-3000:]
    assert out.read_text() == _expected(extravars)
    assert not marker.exists()


def test_the_pull_bundle_refuses_a_template_in_a_nodes_inventory_variables(clean: Path) -> None:
    """The agent writes the node's inventory from the bundle's nodes.json, which ansible-core
    reads as trusted source: a node record carrying a template (its instance type, smuggled into
    the state) stops the bundle on the controller, before any node could run it."""
    from gpuprov.ansible import inventory
    from gpuprov.errors import GpuprovError
    from gpuprov.pull import bundle as bundle_mod

    hostvars = inventory.host_vars({"address": "", "ssh_port": 0, "user": "", "key_file": None,
                                    "instance_type": "g5.xlarge" + TEMPLATE, "expected_gpus": 1})
    with pytest.raises(GpuprovError, match=r"gpuprov_instance_type holds a template"):
        bundle_mod.build(lock={"hash": "abc123"}, extravars={}, group="gpuprov_nodes", group_vars={},
                         profiles={"p": {"hostvars": hostvars, "expect": {}}})
