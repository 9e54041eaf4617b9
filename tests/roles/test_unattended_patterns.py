"""The unattended-upgrades exclusions of every role name GPU packages exactly (finding 17).

Unattended-upgrades skips a package when ``re.match(pattern, name)`` holds for a
pattern of ``Unattended-Upgrade::Package-Blacklist``. Prefix patterns such as ``^libcu``
and ``^libnv`` also matched libcurl4, libcurl3-gnutls, libcups2 and libnvme1 and so kept
their security updates away. Here every fragment the roles write is rendered from the
role's own template and variables (no node needed) and checked the way
unattended-upgrades matches; the probe (gpuprov/probes/test_preflight.py) checks the
merged configuration on a node.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
import yaml

from gpuprov.probes import test_preflight as probe
from tests.conftest import ROOT

ROLES = ROOT / "roles"
# Real package names of the GPU stack (Debian non-free, NVIDIA's repositories) that must
# stay excluded.
GPU_PACKAGES = [
    "nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "nvidia-driver-535", "nvidia-dkms-535",
    "nvidia-fabricmanager-535", "libnvidia-compute-535", "libnvidia-ml1", "libcuda1",
    "libnvcuvid1", "libnvoptix1", "xserver-xorg-video-nvidia", "firmware-nvidia-gsp",
    "cuda-toolkit-11-8", "nvidia-cuda-toolkit", "libcudart11.0", "libcublas11", "libcublaslt11",
    "libcufft10", "libcurand10", "libcusolver11", "libcusparse11", "libcupti11.8",
    "libnppc11", "libnvrtc11.2", "libnvjpeg11", "libnvtoolsext1", "libnvvm4", "libnvblas11",
    "libcudnn8", "libcudnn8-dev", "libnccl2", "nsight-compute-2022.3.0",
]


def _role_vars(role: Path) -> dict:
    out: dict = {}
    for part in ("defaults", "vars"):
        f = role / part / "main.yml"
        if f.exists():
            out.update(yaml.safe_load(f.read_text()) or {})
    return out


def _patterns(text: str) -> list[str]:
    block = re.search(r"Unattended-Upgrade::Package-Blacklist\s*\{(.*?)\};", text, re.S)
    assert block, f"no Package-Blacklist block in:\n{text}"
    return re.findall(r'"([^"]*)"', block.group(1))


def fragments() -> dict[str, list[str]]:
    """Every Package-Blacklist fragment a role writes: ``role:dest`` -> its patterns."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    found: dict[str, list[str]] = {}
    for tasks in sorted(ROLES.glob("*/tasks/*.yml")):
        role = tasks.parent.parent
        for task in yaml.safe_load(tasks.read_text()) or []:
            for module in ("ansible.builtin.template", "ansible.builtin.copy"):
                args = task.get(module) if isinstance(task, dict) else None
                if not isinstance(args, dict) or not str(args.get("dest", "")).startswith("/etc/apt/apt.conf.d/"):
                    continue
                if module.endswith("template"):
                    text = (role / "templates" / args["src"]).read_text()
                    if "Package-Blacklist" in text:
                        text = env.from_string(text).render(ansible_managed="managed", **_role_vars(role))
                else:
                    text = str(args.get("content", ""))
                if "Package-Blacklist" in text:
                    found[f"{role.name}:{args['dest']}"] = _patterns(text)
    return found


def test_every_blacklist_in_the_roles_is_found() -> None:
    written = {p.parts[len(ROLES.parts)] for p in ROLES.rglob("*")
               if p.is_file() and "Package-Blacklist" in p.read_text(errors="ignore")}
    seen = {key.split(":")[0] for key in fragments()}
    assert written == seen == {"gpu_preflight", "nvidia_driver", "cuda", "cudnn"}


@pytest.mark.parametrize("key", sorted(fragments()))
def test_fragment_blocks_no_other_package(key: str) -> None:
    patterns = fragments()[key]
    assert patterns, key
    overreach = {p: probe.blocked(patterns, p) for p in probe.MUST_STAY_UPGRADABLE if probe.blocked(patterns, p)}
    assert not overreach, f"{key} keeps security updates of {overreach} away"
    for rx in patterns:
        assert rx.startswith("^") and rx not in ("^libcu", "^libnv", "^lib", "^cu", "^nv"), (key, rx)
        re.compile(rx)
    assert len(patterns) == len(set(patterns)), f"{key} repeats a pattern: {patterns}"
    # No pattern of a fragment is made redundant by a shorter one of the same fragment.
    subsumed = [(a, b) for a in patterns for b in patterns if a != b and a.startswith(b)]
    assert not subsumed, f"{key}: redundant patterns {subsumed}"


def test_gpu_packages_stay_excluded() -> None:
    merged = probe.blacklist_patterns("\n".join(
        f'Unattended-Upgrade::Package-Blacklist:: "{rx}";' for ps in fragments().values() for rx in ps))
    loose = [p for p in GPU_PACKAGES if not probe.blocked(merged, p)]
    assert not loose, f"GPU packages unattended-upgrades would move: {loose}"
    assert len(merged) == len(set(merged))


def test_role_guard_and_probe_share_the_must_stay_list() -> None:
    role = _role_vars(ROLES / "gpu_preflight")
    assert role["__gpu_preflight_must_stay_upgradable"] == probe.MUST_STAY_UPGRADABLE
    assert {"libcurl4", "libcurl3-gnutls", "libcups2", "libnvme1"} <= set(probe.MUST_STAY_UPGRADABLE)


def test_the_old_prefix_patterns_are_caught() -> None:
    old = ["^cuda-", "^nvidia-", "^libnvidia-", "^nvidia-cuda-", "^libcu", "^libnv", "^libnpp", "^nsight-"]
    assert probe.blocked(old, "libcurl4") == ["^libcu"]
    assert probe.blocked(old, "libnvme1") == ["^libnv"]
    assert {p for p in probe.MUST_STAY_UPGRADABLE if probe.blocked(old, p)} >= {
        "libcurl4", "libcurl3-gnutls", "libcups2", "libnvme1"}


def test_probe_reads_apt_config_dump() -> None:
    dump = ('Unattended-Upgrade::Package-Blacklist "";\n'
            'Unattended-Upgrade::Package-Blacklist:: "^nvidia-";\n'
            'Unattended-Upgrade::Package-Blacklist:: "^libcuda";\n'
            'Unattended-Upgrade::Package-Blacklist:: "^nvidia-";\n')
    assert probe.blacklist_patterns(dump) == ["^nvidia-", "^libcuda"]
