"""`--os ubuntu24.04`: a lock of NVIDIA's ubuntu2404 repository names (gpuprov/data/stack.toml
[os."ubuntu24.04"]), claimed, not proven here: no Ubuntu archive or NVIDIA repository can be reached
from the test machine, so these tests hold the names to the data and its cited sources, the hash to
the OS, and every request the OS cannot serve to one line naming what works."""

from __future__ import annotations

import dataclasses
import json
from datetime import date
from pathlib import Path

import pytest

from gpuprov import defaults, platforms
from gpuprov.errors import BadInput
from gpuprov.lock import os_lines, stack

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "tests" / "fixtures" / "lock_hashes_debian12.json").read_text())
ON = date.fromisoformat(GOLDEN["on"])
OS = "ubuntu24.04"


def _lock(itype: str, **kwargs) -> stack.Lock:
    return stack.resolve(itype, os=OS, on=ON, **kwargs)


# -- what a lock names ------------------------------------------------------------------------------
@pytest.mark.parametrize(("itype", "gpu"), [("p5.48xlarge", "H100"), ("p4d.24xlarge", "A100")])
def test_nvidia_lock_names_ubuntu2404s_r580_packages(itype: str, gpu: str) -> None:
    lock = _lock(itype)
    assert (lock.os, lock.source, lock.gpu, lock.nvswitch) == (OS, "nvidia", gpu, True)
    assert (lock.driver_branch, lock.driver, lock.fabricmanager, lock.kernel_module) == (
        "580", "580.159.04", "580.159.04", "open")
    assert (lock.cuda, lock.cuda_version, lock.cudnn, lock.nccl) == ("12.9", "12.9.1", "9.10.2.21", "2.27.3")
    assert lock.packages == {
        "driver": ["nvidia-driver-580-open", "nvidia-dkms-580-open"],
        "driver_version": "580.159.04-*",
        "pinning": "nvidia-driver-pinning-580.159.04",
        "fabricmanager": "nvidia-fabricmanager",
        "fabricmanager_version": "580.159.04-*",
        "cuda": "cuda-toolkit-12-9", "cuda_version": "12.9.1-*",
        "cudnn": ["libcudnn9-cuda-12", "libcudnn9-dev-cuda-12"], "cudnn_version": "9.10.2.21-1",
        "cudnn_method": "packages",
    }
    assert lock.microcode == {} and lock.efa_installer == "1.34.0"
    assert lock.public()["os"] == OS


def test_volta_gets_the_proprietary_names_and_cuda_13_its_own_packages() -> None:
    lock = _lock("p3.2xlarge")
    assert lock.kernel_module == "proprietary"
    assert lock.packages["driver"] == ["nvidia-driver-580", "nvidia-dkms-580"]
    thirteen = _lock("p5.48xlarge", cuda="13")
    assert (thirteen.cuda, thirteen.packages["cuda"], thirteen.packages["cudnn"]) == (
        "13.0", "cuda-toolkit-13-0", ["libcudnn9-cuda-13", "libcudnn9-dev-cuda-13"])


def test_mirror_lock_is_the_same_names_with_cuda_13_from_the_artifact_mirror() -> None:
    lock = _lock("p4d.24xlarge", source="mirror")
    assert (lock.cuda, lock.packages["cuda_method"], lock.packages["cuda"]) == ("13.0", "archives", "")
    assert lock.packages["driver"] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]
    assert lock.packages["fabricmanager"] == "nvidia-fabricmanager"
    assert {a["component"] for a in lock.cuda_archives} == {"cuda_nvcc", "cuda_cudart", "cuda_cccl", "nccl"}


def test_the_os_is_in_the_hash_and_a_stored_lock_keeps_it() -> None:
    lock = _lock("p5.48xlarge")
    debian = stack.resolve("p5.48xlarge", cuda="12.9", on=ON)  # the same line on Debian 12
    assert lock.short_hash() != debian.short_hash()
    assert lock.short_hash() != dataclasses.replace(lock, os="debian12").short_hash()
    assert lock.short_hash() not in set(GOLDEN["hashes"].values())
    assert stack.from_dict(lock.as_dict()) == lock
    assert stack.from_dict(lock.as_dict()).short_hash() == lock.as_dict()["hash"]


# -- what it refuses, in one line naming what works -------------------------------------------------
@pytest.mark.parametrize(("kwargs", "rule"), [
    ({"source": "distro"}, r"^--os ubuntu24\.04 with package source 'distro': gpuprov reads no Ubuntu archive "
                           r"here \(none can be reached from its test machine\): no lock of --os ubuntu24\.04 "
                           r"--source distro; use --source nvidia or mirror \(NVIDIA's ubuntu2404 repository\)$"),
    ({"cuda": "11.8"}, r"^CUDA 11\.8 with --os ubuntu24\.04 --source nvidia: NVIDIA's repository for Ubuntu 24\.04 "
                       r"\(noble\) packages CUDA 12\.9, 13\.0 only; use --cuda 12\.9$"),
    ({"cuda": "12.4"}, r"^CUDA 12\.4 is packaged by Debian 13 \(trixie\) only: use --os debian13 --source distro, "
                       r"or --cuda 12\.9$"),
    ({"source": "mirror", "cuda": "12.9"}, r"^CUDA 12\.9 with --os ubuntu24\.04 --source mirror: the mirror "
                                           r"\(NVIDIA's layout\) for Ubuntu 24\.04 \(noble\) packages CUDA 13\.0 only; "
                                           r"use --cuda 13\.0$"),
    ({"driver": "570"}, r"^driver 570 is too old for CUDA 12\.9"),
    ({"driver": "580.65.06"}, r"not the release gpuprov pins for branch 580"),
])
def test_what_ubuntu2404_cannot_serve_is_refused(kwargs, rule) -> None:
    with pytest.raises(BadInput, match=rule):
        _lock("p5.48xlarge", **kwargs)


def test_a_branch_other_than_r580_is_refused_saying_why() -> None:
    allowed = os_lines.source(OS, "nvidia")["branches"]
    assert allowed == ["580"]
    assert os_lines.branch_refusal(OS, "nvidia", allowed, "595") == (
        "package source 'nvidia' on --os ubuntu24.04 gives driver branch 580 only, not 595: the only branch "
        "whose package names and release gpuprov has read off NVIDIA's ubuntu2404 repository")
    # Debian 13's refusal is the one it was.
    assert "whose package names gpuprov has not read yet" in os_lines.branch_refusal("debian13", "distro", ["550"], "580")


def test_the_lock_says_it_is_claimed_and_what_it_did_not_read() -> None:
    lock = _lock("p5.48xlarge")
    notes = " ".join(lock.notes)
    assert "Ubuntu 24.04 is claimed, not proven here" in notes
    assert "no CUDA 11.8" in notes and "DCGM: datacenter-gpu-manager 1:3.3.0 is read off NVIDIA's debian12" in notes
    assert "microcode: Ubuntu's intel-microcode and amd64-microcode are not read here" in notes
    noble = platforms.get(OS)
    assert (noble.title, noble.proven, noble.proof) == ("Ubuntu 24.04 (noble)", False, "claimed, not proven here")
    row = next(r for r in lock.public()["platforms"] if r["os"] == OS)
    assert row["proven"] is False and row["how"] == platforms.CLAIMED
    # The line it does not install names what installs there (no CUDA 11.8 on noble), and the
    # `stack` command that shows it keeps the OS.
    assert ("CUDA 12.9 resolves (`gpuprov stack --type p5.48xlarge --cuda 12.9 --os ubuntu24.04 --source "
            "nvidia` shows its lock) but gpuprov does not install it yet: on Ubuntu 24.04 (noble), up, "
            "provision and patch install CUDA 13.0 (--source mirror)") in lock.notes


def test_stack_command_resolves_it_and_says_claimed(capsys) -> None:
    from gpuprov.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main(["stack", "--type", "p5.48xlarge", "--os", OS])
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    words = " ".join(out.split())
    assert "os: Ubuntu 24.04 (noble), claimed, not proven here" in words
    assert platforms.summary().endswith("claimed, not proven here: Ubuntu 20.04 (focal), Ubuntu 22.04 (jammy), "
                                        "Ubuntu 24.04 (noble)")

    with pytest.raises(SystemExit) as exc:
        main(["stack", "--type", "p5.48xlarge", "--os", OS, "--source", "distro"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "gpuprov reads no Ubuntu archive here" in err


# -- the OS lists, and where each fact comes from ---------------------------------------------------
def test_ubuntu2404_is_a_lock_and_aws_os_but_no_local_one() -> None:
    assert OS in defaults.LOCK_OS and OS in defaults.AWS_OS and OS in defaults.UP_OS
    assert OS not in defaults.LOCAL_OS
    assert os_lines.names() == ["debian12", "debian13", OS]
    assert os_lines.default_cuda(OS, "nvidia") == "12.9" and os_lines.default_cuda(OS, "mirror") == "13.0"


def test_every_ubuntu2404_fact_names_its_source_beside_it() -> None:
    text = (ROOT / "gpuprov" / "data" / "stack.toml").read_text().split('[os."ubuntu24.04"]', 1)[1]
    comments = " ".join(" ".join(line.strip(" #") for line in text.splitlines() if "#" in line).split())
    for fact in ("compute/cuda/repos/ubuntu2404/x86_64/", 'Table 4 "Ubuntu 590 package renames"',
                 "nvidia-dkms-580-open", "580.159.04-1ubuntu1", "nvidia-driver-pinning-580.126.20",
                 "nvidia-driver-pinning-580.105.08", "nvidia-fabricmanager_580.105.08-1_amd64.deb",
                 "Jimver/cuda-toolkit issue 365", "container-images/cuda issue 226", "cuda-toolkit-13-0",
                 "packages.ubuntu.com/noble-updates/nvidia-driver-580"):
        assert fact in comments, fact
