"""gpuprov_base's package precheck (roles/gpuprov_base/filter_plugins/gpuprov_packages.py): a
role's apt task runs only when dpkg does not show its packages installed as the role asks."""

from __future__ import annotations

import importlib.util

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "gpuprov_packages", ROOT / "roles/gpuprov_base/filter_plugins/gpuprov_packages.py")
gpuprov_packages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpuprov_packages)
missing = gpuprov_packages.gpuprov_packages_missing

# dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Abbrev}\n' on a converged local node
# (bk1-node-1, 2026-11-25): held (hi), installed (ii), removed with its configuration kept
# (rc); the rdma-core line is made up: unpacked, not configured (iU).
LINES = ["nvidia-driver\t535.309.01-0+deb12u1\thi ", "libcuda1\t535.309.01-0+deb12u1\thi ",
         "nvidia-container-toolkit\t1.17.8-1\tii ", "initramfs-tools\t0.142+deb12u3\trc ",
         "rdma-core\t44.0-2\tiU ",
         "libc6:amd64\t2.36-9+deb12u13\tii "]


def test_installed_as_asked_is_not_missing() -> None:
    assert missing(["nvidia-driver=535.309.01-0+deb12u1", "libcuda1=535.309.01-*",
                    "nvidia-container-toolkit=1.17.8-*", "libc6"], LINES) == []


def test_another_version_a_removed_package_and_an_unknown_one_are_missing() -> None:
    assert missing(["nvidia-driver=535.261.03-*", "initramfs-tools", "rdma-core",
                    "libcuda1=535.309.01"], LINES) == [
        "nvidia-driver=535.261.03-*", "initramfs-tools", "rdma-core", "libcuda1=535.309.01"]


def test_nothing_read_means_everything_is_missing() -> None:
    assert missing(["a", "b=1"], []) == ["a", "b=1"]
    assert missing([], LINES) == []
