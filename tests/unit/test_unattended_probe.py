"""The unattended-upgrades probe checks the node's own locked package names besides the name
families: a blacklist written for one CUDA line (an older release's `^libcudnn8`) leaves
another line's cuDNN 9 packages to unattended-upgrades, and the probe must say so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuprov.lock import stack
from gpuprov.probes import test_preflight as preflight
from gpuprov.probes.test_preflight import BLACKLIST_KEY, locked_packages

FAMILIES = ["^nvidia-", "^libnvidia-", "^cuda-", "^libcudnn", "^libnccl"]


class Host:
    """FIXTURE: `apt-config dump` of the blacklist as apt prints it, and whether
    unattended-upgrades is installed, as testinfra's host answers them."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns

    def run(self, command: str):
        assert command == f"apt-config dump {BLACKLIST_KEY}"
        lines = [f'{BLACKLIST_KEY} "";'] + [f'{BLACKLIST_KEY}:: "{p}";' for p in self.patterns]
        return SimpleNamespace(rc=0, stdout="\n".join(lines) + "\n", stderr="")

    def package(self, name: str):
        return SimpleNamespace(is_installed=True)


def probe(patterns: list[str], lock: dict | None) -> list[str]:
    said: list[str] = []
    preflight.test_unattended_upgrades_leave_gpu_packages(Host(patterns), said.append, SimpleNamespace(stack=lock))
    return said


def test_the_locks_names_are_read_from_its_packages() -> None:
    lock = stack.resolve("p4d.24xlarge", source="nvidia", cuda="13").as_dict()
    assert locked_packages(lock) == ["nvidia-driver-580-open", "nvidia-dkms-580-open", "nvidia-driver-pinning-580.159.04",
                                     "nvidia-fabricmanager", "cuda-toolkit-13-0", "libcudnn9-cuda-13",
                                     "libcudnn9-dev-cuda-13"]
    # a line that comes as archives names no packages of its own
    assert "cuda-toolkit-13-0" not in locked_packages(stack.resolve(None, source="mirror", cuda="13").as_dict())
    assert locked_packages(None) == []


def test_the_role_s_families_guard_a_cuda_13_node() -> None:
    lock = stack.resolve("p4d.24xlarge", source="nvidia", cuda="13").as_dict()
    said = probe(FAMILIES, lock)
    assert "the lock's 5 package names besides the families" in said[0]


def test_a_blacklist_written_for_cudnn_8_fails_on_a_cudnn_9_node() -> None:
    lock = stack.resolve("p4d.24xlarge", source="nvidia", cuda="13").as_dict()
    narrow = ["^nvidia-", "^libnvidia-", "^cuda-", "^libcudnn8", "^libnccl"]
    with pytest.raises(AssertionError, match=r"skip \['libcudnn9-cuda-13', 'libcudnn9-dev-cuda-13'\]"):
        probe(narrow, lock)
    # the same blacklist passes a node whose lock installs cuDNN 8 (no lock: the families only)
    probe(narrow, None)
