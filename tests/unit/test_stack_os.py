"""The lock's OS (`os`): Debian 12 locks exactly as before (fields and hash), Debian 13 (trixie)
resolved from its own archive's packages (gpuprov/data/stack.toml [os.debian13]), and each request
an OS cannot serve refused with one line naming what works."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import date
from pathlib import Path

import pytest

from gpuprov import platforms
from gpuprov.errors import BadInput
from gpuprov.lock import cuda_lines, drivers, os_lines, stack

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests" / "fixtures" / "lock_hashes_debian12.json").read_text())
ON = date.fromisoformat(GOLDEN["on"])


def _request(key: str) -> dict:
    itype, cuda, source, driver, module = key.split("|")
    return {"instance_type": itype, "cuda": cuda, "source": source,
            "driver": None if driver == "-" else driver, "kernel_module": None if module == "-" else module}


# -- Debian 12: every lock shape keeps its hash ----------------------------------------------------
def test_every_debian12_lock_shape_keeps_its_hash() -> None:
    hashes = GOLDEN["hashes"]
    assert len(hashes) > 250  # types x lines x sources x branches x flavours that resolve
    moved = {}
    for key, expected in hashes.items():
        req = _request(key)
        for os in (None, "debian12"):
            lock = stack.resolve(**req, on=ON, os=os)
            assert lock.os == "debian12"
            if lock.short_hash() != expected:
                moved[(key, os)] = lock.short_hash()
    assert not moved, moved


# cuDNN 8.9's archive as the mirror built it until 2026-12-02 (xz at preset 1).
CUDNN_XZ = ("cudnn-linux-x86_64-8.9.6.50_cuda11-archive.tar.xz",
            "6b3bfc53746d8a3cebe8440654df80d8ade61a09b377541352b8bce0f0023891")


def _with_cudnn_xz(lock: stack.Lock) -> stack.Lock:
    if not lock.cudnn_archive.startswith("cudnn-linux-x86_64-8.9.6.50_"):
        return lock
    return dataclasses.replace(lock, cudnn_archive=CUDNN_XZ[0], cudnn_archive_sha256=CUDNN_XZ[1])


def test_the_locks_that_moved_moved_for_fabric_managers_name_alone() -> None:
    """R580 and newer from NVIDIA's repository or the mirror: fabric manager is NVIDIA's
    nvidia-fabricmanager (nvidia-fabricmanager-580 does not exist there). Those hashes moved for
    that alone: with the old name (and cuDNN 8.9's archive as it was then, below), each lock
    gives its old hash again; every other shape kept its hash (above)."""
    renamed = GOLDEN["fabricmanager_renamed"]
    assert len(renamed) > 100
    for key, before in renamed.items():
        lock = stack.resolve(**_request(key), on=ON)
        assert lock.packages["fabricmanager"] == "nvidia-fabricmanager", key
        assert int(lock.driver_branch) >= 580 and lock.source in ("nvidia", "mirror"), key
        old = dataclasses.replace(_with_cudnn_xz(lock), packages={
            **lock.packages, "fabricmanager": f"nvidia-fabricmanager-{lock.driver_branch}"})
        assert old.short_hash() == before != lock.short_hash(), key
    kept = [k for k in GOLDEN["hashes"] if k not in renamed]
    assert kept and all(stack.resolve(**_request(k), on=ON).packages["fabricmanager"] != "nvidia-fabricmanager"
                        for k in kept)


def test_the_locks_that_moved_moved_for_cudnn_89s_plain_tar_alone() -> None:
    """Since 2026-12-02 the mirror builds cuDNN 8.9's archive as a plain tar (its name and sha256
    in data/stack.toml [cudnn]): every lock of CUDA 11.8 names it, so their hashes moved. With
    the .tar.xz's name and sha256, each gives its hash before again; no other lock moved."""
    moved = GOLDEN["cudnn_plain_tar"]
    assert len(moved) > 100
    for key, before in moved.items():
        lock = stack.resolve(**_request(key), on=ON)
        assert lock.cudnn_archive == "cudnn-linux-x86_64-8.9.6.50_cuda11-archive.tar", key
        assert _with_cudnn_xz(lock).short_hash() == before != lock.short_hash() == GOLDEN["hashes"][key], key
    others = [k for k in GOLDEN["hashes"] if k not in moved]
    assert others and not any(stack.resolve(**_request(k), on=ON).cudnn_archive.startswith("cudnn-linux-x86_64-8.9")
                              for k in others)


def test_a_stored_lock_without_os_is_debian12_and_keeps_its_hash() -> None:
    lock = stack.resolve("p4d.24xlarge", on=ON)
    stored = lock.as_dict()
    del stored["os"]  # as a lock stored before there was an OS
    back = stack.from_dict(stored)
    assert back.os == "debian12" and back.short_hash() == stored["hash"] == lock.short_hash()
    assert lock.public()["os"] == "debian12"


# -- Debian 13: trixie's own packages ---------------------------------------------------------------
def test_debian13_distro_lock_names_trixies_packages() -> None:
    lock = stack.resolve("g5.xlarge", source="distro", os="debian13", on=ON)
    assert (lock.os, lock.driver_branch, lock.driver, lock.kernel_module) == ("debian13", "550", "550.163.01", "proprietary")
    assert (lock.cuda, lock.cuda_version, lock.nccl, lock.cudnn) == ("12.4", "12.4.131", "2.22.3", "9.10.2.21")
    assert lock.packages["driver"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"]
    assert lock.packages["driver_version"] == "550.163.01-*"
    assert (lock.packages["cuda"], lock.packages["cuda_version"]) == ("nvidia-cuda-toolkit", "12.4.131~12.4.1-*")
    assert (lock.packages["nccl"], lock.packages["nccl_version"]) == (["libnccl2"], "2.22.3-1-1")
    assert lock.fabricmanager is None and lock.dcgm is None
    # trixie's own microcode releases (non-free-firmware), not Debian 12's
    assert lock.microcode == {"intel": "3.20260925.1~deb13u1", "amd": "3.20250311.1"}
    notes = " ".join(lock.notes)
    assert "NVIDIA's own debian13 repository gives R580 on trixie" in notes
    assert "cuDNN 9.10.2.21: the artifact mirror's archive" in notes and "downloader package" in notes
    # cuDNN 9 for CUDA 12 from the artifact mirror, pinned by the rebuilt archive's sha256; CUDA itself
    # from trixie's packages (no CUDA archive)
    assert (lock.cudnn_archive, lock.packages["cudnn_method"], lock.cuda_archives) == (
        "cudnn-linux-x86_64-9.10.2.21_cuda12-archive.tar", "tarball", ())
    assert lock.cudnn_archive_sha256 == "49489cccca471f206ea4f9baa8593d6b907c96bfed56c1d87c4540861a7856ad"
    assert "Debian 13 security support (trixie-security) applies" in notes
    assert "Debian's archive has no NCCL" not in notes and "535" not in notes
    assert "does not install it yet" not in notes  # `up` installs CUDA 12.4 from trixie's archive
    # os is part of the hash; a round trip keeps the lock and the hash
    assert stack.from_dict(lock.as_dict()) == lock
    assert lock.short_hash() not in set(GOLDEN["hashes"].values())
    assert lock.short_hash() != dataclasses.replace(lock, os="debian12").short_hash()


@pytest.mark.parametrize("itype", ["docker-node", "g4dn.xlarge", "p3.2xlarge"])
def test_trixie_gives_the_proprietary_modules_its_open_one_does_not_build(itype) -> None:
    """No GPU, Turing (open by default elsewhere) and Volta all get nvidia-kernel-dkms: trixie's
    nvidia-open-kernel-dkms 550.163.01-2 does not build for trixie's kernels (seen on a trixie node,
    tests/e2e/test_debian13_e2e.py), so the open flavour is refused there, saying why."""
    lock = stack.resolve(itype, source="distro", os="debian13", on=ON)
    assert lock.kernel_module == "proprietary" and "nvidia-kernel-dkms" in lock.packages["driver"]
    if itype == "p3.2xlarge":
        return  # Volta: the open modules cannot drive it anywhere (its own refusal)
    with pytest.raises(BadInput, match=r"^package source 'distro' cannot give the open kernel modules: Debian "
                                       r"13's open module .* does not build against trixie's kernels 6\.12\.117 "
                                       r"and 6\.12\.118 .*; use the proprietary modules \(nvidia-kernel-dkms\)$"):
        stack.resolve(itype, source="distro", os="debian13", kernel_module="open", on=ON)


def test_r550_warns_as_r535_does_and_names_debian13s_support_and_r580() -> None:
    lock = stack.resolve("g5.xlarge", source="distro", os="debian13", on=ON).as_dict()
    line = stack.eol_warning(lock, ON)
    assert line.startswith("driver branch R550 (production) reached its end of life in 2025-06")
    assert "Debian 13 security support (trixie-security) applies, not NVIDIA's" in line
    assert "gives R580" in line and "bookworm" not in line
    # Debian 12's warning is the one it always was.
    old = stack.resolve("g5.xlarge", source="distro", on=ON).as_dict()
    assert stack.eol_warning(old, ON) == drivers.eol_warning(old, ON) and "bookworm-security" in stack.eol_warning(old, ON)
    assert stack.eol_warning(stack.resolve("g5.xlarge", on=ON).as_dict(), ON) is None


@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"source": "nvidia"}, r"^--os debian13 with package source 'nvidia': gpuprov has not read the package "
                           r"names of NVIDIA's debian13 repository.*use --source distro"),
    ({"source": "mirror"}, r"^--os debian13 with package source 'mirror': .*use --source distro"),
    ({"source": "distro", "cuda": "11.8"}, r"Debian 13 \(trixie\)'s archive packages CUDA 12\.4 only; use --cuda 12\.4$"),
    ({"source": "distro", "cuda": "13"}, r"CUDA 13\.0 with --os debian13 --source distro: .*use --cuda 12\.4$"),
    ({"source": "distro", "driver": "580"}, r"on --os debian13 carries driver branch 550 only, not 580"),
    ({"source": "distro", "driver": "550.54.15"}, r"not the release gpuprov pins for branch 550"),
])
def test_debian13_refusals_name_what_works(kwargs, rule) -> None:
    with pytest.raises(BadInput, match=rule):
        stack.resolve("g5.xlarge", os="debian13", on=ON, **kwargs)


@pytest.mark.parametrize("source", ["nvidia", "distro", "mirror"])
def test_cuda_12_4_is_debian13s_alone(source) -> None:
    with pytest.raises(BadInput, match=r"^CUDA 12\.4 is packaged by Debian 13 \(trixie\) only: use --os debian13 "
                                       r"--source distro, or --cuda 11\.8$"):
        stack.resolve("g5.xlarge", cuda="12.4", source=source, on=ON)


def test_blackwell_is_beyond_cuda_12_4_and_an_unknown_os_is_refused() -> None:
    with pytest.raises(BadInput, match=r"CUDA 12\.4 cannot drive B200 \(sm_100\).*needs CUDA >= 12\.8"):
        stack.resolve("p6-b200.48xlarge", source="distro", os="debian13", on=ON)
    with pytest.raises(BadInput, match=r"^--os debian14: gpuprov's stack data has no facts for it \(known: "
                                       r"debian12, debian13, ubuntu24\.04\)$"):
        stack.resolve("g5.xlarge", source="distro", os="debian14", on=ON)


def test_a_major_names_the_oss_own_line_there_and_the_common_line_elsewhere() -> None:
    assert cuda_lines.spelled("12") == "12.9" and cuda_lines.spelled("12", "debian12") == "12.9"
    assert cuda_lines.spelled("12", "debian13") == "12.4" and cuda_lines.spelled("12.x", "debian13") == "12.4"
    assert stack.resolve("g5.xlarge", cuda="12", source="distro", os="debian13", on=ON).cuda == "12.4"
    # `types` marks the lines of every OS: Debian 13's own is not a type's.
    assert "12.4" in cuda_lines.names() and "12.4" not in cuda_lines.lines_for_arch("sm_86")
    assert os_lines.default_cuda("debian13", "distro") == "12.4" and os_lines.default_cuda("debian12", "distro") == "11.8"


def test_every_debian13_fact_names_its_source_beside_it() -> None:
    """Each trixie package and release in the data sits under a comment that names where it was
    read (the test machine's package cache on 2026-11-26, packages.debian.org/trixie)."""
    text = (ROOT / "gpuprov" / "data" / "stack.toml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    for fact in ("nvidia-open-kernel-dkms 550.163.01-2", "nvidia-kernel-dkms", "nvidia-cuda-toolkit 12.4.131~12.4.1-2",
                 "libnccl2 2.22.3-1-1", "nvidia-cudnn (9.0.0.312~cuda12) is a downloader package",
                 "CUDA 12.4 Update 1 >= 550.54.15", "2026-11-26",
                 "packages.debian.org/trixie"):
        assert fact in comments, fact
    assert re.search(r"slurm-wlm 24\.11\.5-4\+deb13u1", (ROOT / "gpuprov" / "platforms.py").read_text())


def test_debian13_is_proven_on_local_nodes_by_its_end_to_end_test() -> None:
    trixie = platforms.get("debian13")
    assert (trixie.title, trixie.proven, trixie.slurm) == ("Debian 13 (trixie)", True, "24.11.5")
    assert trixie.where == ("local nodes: the whole site of --source distro; the molecule scenarios of the "
                            "container_runtime, gpu_preflight, microcode, monitoring, node_patch, rdma, slurm and "
                            "spot_interruption roles")
    assert trixie.proof == f"proven here ({trixie.where})"
    assert (ROOT / platforms.DEBIAN13_TEST).is_file()
    row = next(r for r in stack.resolve("g5.xlarge", source="distro", os="debian13", on=ON).public()["platforms"]
               if r["os"] == "debian13")
    assert row["proven"] is True and row["how"].startswith(f"{platforms.DEBIAN13_TEST}: a local node of the image "
                                                          "gpuprov/node:trixie")
