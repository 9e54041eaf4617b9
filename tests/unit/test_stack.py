"""The version lock resolver over a table of types and requests, refusals included."""

from __future__ import annotations

from datetime import date

import pytest

from gpuprov.errors import BadInput
from gpuprov.lock import stack

# The day lifecycle rules are judged on in these tests (R535 past its end of life, R580 not).
ON = date(2026, 11, 23)


@pytest.mark.parametrize(
    ("itype", "kwargs", "driver", "fabricmanager", "efa"),
    [
        ("p4d.24xlarge", {}, "580.159.04", "580.159.04", "1.34.0"),
        ("p4de.24xlarge", {}, "580.159.04", "580.159.04", "1.34.0"),
        ("p5.48xlarge", {}, "580.159.04", "580.159.04", "1.34.0"),
        ("p5e.48xlarge", {}, "580.159.04", "580.159.04", "1.34.0"),
        ("p5en.48xlarge", {"driver": "550"}, "550.163.01", "550.163.01", "1.34.0"),
        ("p4d.24xlarge", {"driver": "535"}, "535.309.01", "535.309.01", "1.34.0"),
        ("g5.xlarge", {}, "580.159.04", None, None),
        ("p3.2xlarge", {}, "580.159.04", None, None),
        ("g6.xlarge", {"driver": "525"}, "525.147.05", None, None),
        ("p3.2xlarge", {"driver": "535.309.01"}, "535.309.01", None, None),
        ("docker-node", {"source": "distro"}, "535.309.01", None, None),
        ("g4dn.xlarge", {"source": "distro"}, "535.309.01", None, None),
    ],
)
def test_resolves(itype, kwargs, driver, fabricmanager, efa) -> None:
    lock = stack.resolve(itype, on=ON, **kwargs)
    assert (lock.driver, lock.fabricmanager, lock.efa_installer) == (driver, fabricmanager, efa)
    assert lock.cuda == "11.8" and lock.cudnn.startswith("8.9.")
    if lock.nvswitch:
        assert lock.fabricmanager == lock.driver
    assert lock.driver_branch == lock.driver.split(".")[0]


@pytest.mark.parametrize(
    ("itype", "kwargs", "rule"),
    [
        ("p5.48xlarge", {"cuda": "11.7"}, r"sm_90 needs CUDA >= 11\.8"),
        ("g6.xlarge", {"cuda": "11.7"}, r"sm_89 needs CUDA >= 11\.8"),
        ("p4d.24xlarge", {"driver": "515"}, r"CUDA 11\.8 needs driver >= 520\.61\.05"),
        ("p5.48xlarge", {"driver": "515"}, r"CUDA 11\.8 needs driver >= 520\.61\.05"),
        ("p5e.48xlarge", {"driver": "535"}, r"H200.*needs driver >= 550"),
        ("g6e.xlarge", {"driver": "525"}, r"L40S.*needs driver >= 535"),
        ("p4d.24xlarge", {"source": "distro"}, "needs fabric manager"),
        ("g5.xlarge", {"source": "distro", "driver": "550"}, "carries driver branch 535 only"),
        ("g5.xlarge", {"driver": "470"}, r"needs driver >= 520"),
        ("g5.xlarge", {"driver": "560"}, "pins no release of driver branch 560"),
        ("g5.xlarge", {"driver": "535.54.03"}, "not the release gpuprov pins"),
        ("p6-b200.48xlarge", {}, r"CUDA 11\.8 cannot drive B200 \(sm_100\).*needs CUDA >= 12\.8"),
        ("p3.2xlarge", {"kernel_module": "open"}, r"open kernel modules cannot drive V100.*Volta"),
        ("g5.xlarge", {"source": "distro", "kernel_module": "open"}, r"535\.261\.03.*does not build"),
        ("g5.xlarge", {"kernel_module": "closed"}, "unknown kernel module 'closed'"),
        ("g5.xlarge", {"cuda": "12.0"}, "has no CUDA 12.0"),
        ("g5.xlarge", {"source": "apt"}, "unknown package source"),
        ("p9.huge", {}, "unknown instance type"),
    ],
)
def test_refuses_with_the_rule(itype, kwargs, rule) -> None:
    with pytest.raises(BadInput, match=rule):
        stack.resolve(itype, on=ON, **kwargs)


def test_distro_source_rolls_back_only_to_a_checked_earlier_release() -> None:
    pin = stack.resolve("g5.xlarge", source="distro", on=ON).as_dict()
    assert (pin["kernel_module"], pin["driver"]) == ("proprietary", "535.309.01")
    back = stack.resolve("g5.xlarge", source="distro", driver="535.261.03", on=ON).as_dict()
    assert back["driver"] == "535.261.03" and back["packages"]["driver_version"] == "535.261.03-*"
    assert any("earlier release than branch 535's pin 535.309.01" in n for n in back["notes"])
    # Only the distro source carries that release: NVIDIA's repository pins one per branch.
    with pytest.raises(BadInput, match=r"not the release gpuprov pins for branch 535 \(535\.309\.01 with"):
        stack.resolve("g5.xlarge", source="nvidia", driver="535.261.03", on=ON)


def test_same_request_same_lock_and_round_trip() -> None:
    a = stack.resolve("p4d.24xlarge")
    b = stack.resolve("p4d.24xlarge")
    assert a == b and a.short_hash() == b.short_hash()
    assert stack.from_dict(a.as_dict()) == a
    assert stack.resolve("p4d.24xlarge", driver="550").short_hash() != a.short_hash()


def test_package_names_follow_the_source() -> None:
    nvidia = stack.resolve("p4d.24xlarge", on=ON).packages
    assert nvidia["driver"] == ["nvidia-driver-580-open", "nvidia-dkms-580-open"]
    assert nvidia["pinning"] == "nvidia-driver-pinning-580.159.04"
    # NVIDIA's name from R580 (the branch's through R575: nvidia-fabricmanager-535 below)
    assert nvidia["fabricmanager"] == "nvidia-fabricmanager"
    assert nvidia["fabricmanager_version"] == nvidia["driver_version"] == "580.159.04-*"
    volta = stack.resolve("p3.2xlarge", on=ON).packages
    assert volta["driver"] == ["nvidia-driver-580", "nvidia-dkms-580"]
    # NVIDIA's pinning packages exist from the 570 series on: none for R535.
    assert "pinning" not in stack.resolve("p4d.24xlarge", driver="535", on=ON).packages
    assert nvidia["cudnn_version"] == "8.9.6.50-1+cuda11.8" and nvidia["cudnn_method"] == "packages"
    distro = stack.resolve("docker-node", source="distro").packages
    assert distro["driver"] == ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi"]
    assert distro["cuda"] == "nvidia-cuda-toolkit" and distro["cudnn_method"] == "tarball"


# The cudnn scenario takes the archive's checksum from the lock through the plays' mapping
# (tests/unit/test_lock_mapping.py: no version or checksum outside the lock).


# Finding 16: images are pinned by digest in the lock and pulled by digest only; the site
# image's Python packages are installed with --require-hashes.
def _images_filter():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "roles/base_images/filter_plugins/images.py"
    spec = importlib.util.spec_from_file_location("base_images_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_base_images_are_pinned_by_digest_with_the_tag_beside_it() -> None:
    import re

    lock = stack.resolve("docker-node", source="distro")
    assert lock.base_images
    for image in lock.base_images:
        assert re.fullmatch(r"nvidia/cuda:[0-9A-Za-z._-]+@sha256:[0-9a-f]{64}", image), image
    for req in lock.site_pip_requirements:
        assert re.fullmatch(r"\S+==\S+( --hash=sha256:[0-9a-f]{64})+", req), req
    assert stack.from_dict(lock.as_dict()) == lock


def test_role_defaults_follow_the_lock() -> None:
    from pathlib import Path

    import yaml

    role = Path(__file__).resolve().parents[2] / "roles/base_images/defaults/main.yml"
    defaults = yaml.safe_load(role.read_text())
    lock = stack.resolve("g5.xlarge")
    assert defaults["base_images_pull"] == list(lock.base_images)
    assert defaults["base_images_site_from"] == lock.base_images[0]
    assert defaults["base_images_site_pip_packages"] == list(lock.site_pip_requirements)


def test_images_are_pulled_by_digest_only() -> None:
    f = _images_filter()
    d = "sha256:" + "a" * 64
    [ref] = f.pinned_images([f"nvidia/cuda:11.8.0-x@{d}"])
    assert ref["pull"] == f"nvidia/cuda@{d}" and ref["name"] == "nvidia/cuda:11.8.0-x"
    [ref] = f.pinned_images([f"nvidia/cuda:11.8.0-x@{d}"], "http://10.0.0.5:5000/")
    assert ref["pull"] == f"10.0.0.5:5000/nvidia/cuda@{d}" and not ref["override"]
    for unpinned in ("nvidia/cuda:11.8.0-x", "nvidia/cuda:11.8.0-x@sha256:abc", "ubuntu"):
        with pytest.raises(Exception, match="not pinned by digest"):
            f.pinned_images([unpinned])
    # A mirror's own digest replaces the lock's only with a mirror, and only for that name.
    served = "sha256:" + "b" * 64
    [ref] = f.pinned_images([f"nvidia/cuda:11.8.0-x@{d}"], "10.0.0.5:5000", {"nvidia/cuda:11.8.0-x": served})
    assert ref["pull"] == f"10.0.0.5:5000/nvidia/cuda@{served}" and ref["override"]
    [ref] = f.pinned_images([f"nvidia/cuda:11.8.0-x@{d}"], "", {"nvidia/cuda:11.8.0-x": served})
    assert ref["digest"] == d
    [ref] = f.pinned_images([f"localhost:5000/x/y@{d}"])
    assert ref["pull"] == f"localhost:5000/x/y@{d}" and not ref["tagged"]
