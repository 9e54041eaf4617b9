"""CUDA lines as lock data (issue 33, first slice): 11.8 (the default), 12.9 and 13.0 resolve,
each with its minimum driver, architectures, cuDNN and NCCL; the refusals say why and what
works; `types` marks the lines; and every CUDA 11.8 lock keeps the hash it had."""

from __future__ import annotations

import re
from datetime import date

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput
from gpuprov.lock import cuda_lines, drivers, stack
from gpuprov.lock.stack_choice import NOT_INSTALLED_CUDA, StackChoice

# The day lifecycle rules are judged on (R535 past its end of life, R580 not), as test_stack.py.
ON = date(2026, 11, 23)
R580 = "580.159.04"


@pytest.mark.parametrize(
    ("asked", "line", "release", "cudnn", "nccl", "cuda_package", "cudnn_packages"),
    [
        ("12.9", "12.9", "12.9.1", "9.10.2.21", "2.27.3", "cuda-toolkit-12-9",
         ["libcudnn9-cuda-12", "libcudnn9-dev-cuda-12"]),
        ("12", "12.9", "12.9.1", "9.10.2.21", "2.27.3", "cuda-toolkit-12-9",
         ["libcudnn9-cuda-12", "libcudnn9-dev-cuda-12"]),
        ("13.0", "13.0", "13.0.2", "9.17.1.4", "2.27.7", "cuda-toolkit-13-0",
         ["libcudnn9-cuda-13", "libcudnn9-dev-cuda-13"]),
        ("13", "13.0", "13.0.2", "9.17.1.4", "2.27.7", "cuda-toolkit-13-0",
         ["libcudnn9-cuda-13", "libcudnn9-dev-cuda-13"]),
        ("13.x", "13.0", "13.0.2", "9.17.1.4", "2.27.7", "cuda-toolkit-13-0",
         ["libcudnn9-cuda-13", "libcudnn9-dev-cuda-13"]),
    ],
)
def test_b200_resolves_under_12_9_and_13(asked, line, release, cudnn, nccl, cuda_package, cudnn_packages) -> None:
    lock = stack.resolve("p6-b200.48xlarge", cuda=asked, on=ON)
    assert (lock.cuda, lock.cuda_version, lock.cudnn, lock.nccl) == (line, release, cudnn, nccl)
    # The newest long-term branch the line allows, open modules (Blackwell), fabric manager == driver.
    assert (lock.driver_branch, lock.driver, lock.fabricmanager, lock.kernel_module) == ("580", R580, R580, "open")
    assert lock.packages["cuda"] == cuda_package and lock.packages["cuda_version"] == f"{release}-*"
    assert lock.packages["cudnn"] == cudnn_packages and lock.packages["cudnn_version"] == f"{cudnn}-1"
    assert lock.packages["cudnn_method"] == "packages" and lock.cudnn_archive == ""
    # Not installable yet, no base image digest cited, no nccl-tests pinned: each said in a note.
    assert lock.base_images == () and lock.nccl_tests is None and lock.nccl_tests_sha256 == ""
    notes = " | ".join(lock.notes)
    assert f"CUDA {line} resolves (`gpuprov stack --type p6-b200.48xlarge --cuda {line}`" in notes
    assert f"nvidia/cuda:{release}-cudnn-runtime-ubuntu22.04" in notes and "not pinned by digest" in notes
    public = lock.public()
    assert (public["cuda"], public["cuda_release"], public["cuda_installable"]) == (line, release, False)
    assert stack.from_dict(lock.as_dict()) == lock


def test_each_line_is_one_lock_and_the_spellings_name_it() -> None:
    hashes = {asked: stack.resolve("p5.48xlarge", cuda=asked, on=ON).short_hash()
              for asked in ("11.8", "11", "12.9", "12.x", "13.0", "13", "13.X")}
    assert hashes["11.8"] == hashes["11"]
    assert hashes["12.9"] == hashes["12.x"]
    assert hashes["13.0"] == hashes["13"] == hashes["13.X"]
    assert len({hashes["11.8"], hashes["12.9"], hashes["13.0"]}) == 3


def test_v100_resolves_under_11_8_and_12_9() -> None:
    for line in ("11.8", "12.9"):
        lock = stack.resolve("p3.2xlarge", cuda=line, on=ON)
        # R580 is both the newest long-term branch and Volta's last; the proprietary modules.
        assert (lock.cuda, lock.driver, lock.kernel_module) == (line, R580, "proprietary")
    # cuDNN 9.10.2, whose matrix still has Volta, for the 12.9 line.
    assert stack.resolve("p3.2xlarge", cuda="12.9", on=ON).cudnn == "9.10.2.21"


@pytest.mark.parametrize(
    ("itype", "kwargs", "rule"),
    [
        # A GPU too old for 13.x: named with its architecture, and the lines that do drive it.
        ("p3.2xlarge", {"cuda": "13"},
         r"CUDA 13\.0 cannot drive V100 \(sm_70, Volta\) on p3\.2xlarge: CUDA 13\.0 supports sm_75 and newer"
         r".*; use --cuda 12\.9 or --cuda 11\.8$"),
        ("p3dn.24xlarge", {"cuda": "13.0"}, r"sm_70, Volta.*use --cuda 12\.9 or --cuda 11\.8$"),
        # B200 under 11.8 (the default): the first CUDA for sm_100, and the --cuda values that work.
        ("p6-b200.48xlarge", {}, r"CUDA 11\.8 cannot drive B200 \(sm_100\).*needs CUDA >= 12\.8.*"
                                 r"; use --cuda 13\.0 or --cuda 12\.9$"),
        # The line's minimum driver: older branches refused with it.
        ("p5.48xlarge", {"cuda": "12.9", "driver": "570"}, r"driver 570 is too old for CUDA 12\.9: .*>= 575\.57\.08"),
        ("p5.48xlarge", {"cuda": "13", "driver": "570"}, r"driver 570 is too old for CUDA 13\.0: .*>= 580\.95\.05"),
        ("p4d.24xlarge", {"cuda": "12.9", "driver": "535"}, r"too old for CUDA 12\.9: .*>= 575\.57\.08"),
        ("g5.xlarge", {"cuda": "13", "driver": "550.163.01"}, r"too old for CUDA 13\.0"),
        # Sources without the line's pieces.
        ("g5.xlarge", {"cuda": "12.9", "source": "distro"}, r"package source 'distro': Debian 12's archive "
                                                             r"packages CUDA 11\.8 only.*--source nvidia"),
        ("g5.xlarge", {"cuda": "12.9", "source": "mirror"}, r"package source 'mirror'.*carries no nvcc; use --source nvidia, or --cuda 13 with --source mirror"),
        ("g5.xlarge", {"cuda": "13", "source": "distro"}, r"package source 'distro'.*CUDA 13 needs driver R580"),
        # Lines the data lacks, and spellings it refuses.
        ("g5.xlarge", {"cuda": "12.8"}, r"has no CUDA 12\.8 \(available: 11\.8, 12\.4, 12\.9, 13\.0\)"),
        ("g5.xlarge", {"cuda": "14"}, r"has no CUDA 14\.x line"),
        ("g5.xlarge", {"cuda": "13.5"}, r"has no CUDA 13\.5"),
        ("g5.xlarge", {"cuda": "13;rm"}, r"--cuda '13;rm': expected a CUDA line"),
        ("g5.xlarge", {"cuda": "{{ x }}"}, r"expected a CUDA line"),
    ],
)
def test_refusals_say_why_and_what_works(itype, kwargs, rule) -> None:
    with pytest.raises(BadInput, match=rule):
        stack.resolve(itype, on=ON, **kwargs)


def test_the_arch_rule_still_speaks_before_the_data_for_old_cuda() -> None:
    # A release older than the GPU's first CUDA: the architecture's rule, not "no such line".
    with pytest.raises(BadInput, match=r"sm_90 needs CUDA >= 11\.8"):
        stack.resolve("p5.48xlarge", cuda="11.7", on=ON)


def test_every_line_names_its_facts_and_a_line_invents_no_digest() -> None:
    lines = cuda_lines.lines()
    assert cuda_lines.names() == ["11.8", "12.4", "12.9", "13.0"]
    for name, facts in lines.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", facts["version"]) and facts["version"].startswith(name + ".")
        assert re.fullmatch(r"\d{3}\.\d+(\.\d+)?", facts["min_driver"])
        assert re.fullmatch(r"sm_\d+", facts["arch_min"]) and re.fullmatch(r"sm_\d+", facts["arch_max"])
        # The base images the roles pull are pinned by digest, or there are none.
        for image in facts.get("base_images", []):
            assert re.fullmatch(r"\S+:\S+@sha256:[0-9a-f]{64}", image), image
        if not facts.get("installable"):
            assert facts["base_images"] == [] and facts["base_image_tags"]
    # The default branch serves every line: its pin is at least each line's minimum.
    assert all(drivers._v(R580) >= drivers._v(f["min_driver"]) for f in lines.values())
    # 11.8's minimum is the one the driver rules already used.
    assert lines["11.8"]["min_driver"] == drivers.CUDA_MIN_DRIVER["11.8"]


def test_arch_ranges_agree_with_the_first_cuda_of_each_architecture() -> None:
    for arch, first in stack.ARCH_MIN_CUDA.items():
        for name, facts in cuda_lines.lines().items():
            within = cuda_lines.arch_number(arch) <= cuda_lines.arch_number(facts["arch_max"])
            assert (drivers._v(name) >= drivers._v(first)) == within, (arch, name)
    assert cuda_lines.lines_for_arch("sm_70") == ["11.8", "12.9"]
    assert cuda_lines.lines_for_arch("sm_75") == ["11.8", "12.9", "13.0"]
    assert cuda_lines.lines_for_arch("sm_100") == ["12.9", "13.0"]
    assert cuda_lines.lines_for_arch(None) == ["11.8", "12.9", "13.0"]


def test_types_mark_the_lines_each_gpu_can_use() -> None:
    rows = {t.name: t.row() for t in catalog.all_types()}
    assert rows["p6-b200.48xlarge"]["cuda_lines"] == ["12.9", "13.0"]
    assert rows["p3.2xlarge"]["cuda_lines"] == ["11.8", "12.9"]
    assert rows["p5.48xlarge"]["cuda_lines"] == ["11.8", "12.9", "13.0"]
    assert rows["docker-node"]["cuda_lines"] == ["11.8", "12.9", "13.0"]
    # The mark is what the resolver does: each marked line resolves for the type, no other.
    for itype in catalog.all_types():
        resolves = []
        for line in cuda_lines.names():
            try:
                stack.resolve_types([itype], cuda=line, on=ON)
            except BadInput:
                continue
            resolves.append(line)
        assert rows[itype.name]["cuda_lines"] == resolves, itype.name


# The hashes of CUDA 11.8 locks as gpuprov resolved them before there were CUDA lines (read off
# the code of commit 2024181 on ON): the lines must not move a single one. The R580 locks of
# NVIDIA's repository and the mirror moved once since, for a reason of their own (2026-11-28:
# fabric manager from R580 is NVIDIA's nvidia-fabricmanager, not nvidia-fabricmanager-580; p4d
# was 7465450da0a7, p5 aec7c6922dd1, p3 353dfa37bad9, g5 a6ca2c86b382:
# tests/fixtures/lock_hashes_debian12.json "fabricmanager_renamed"), and every one of them on
# 2026-12-02 (cuDNN 8.9's archive a plain tar: its hash before each is in that file's
# "cudnn_plain_tar", the same lock with the .tar.xz's name and sha256 gives it:
# tests/unit/test_stack_os.py).
HASHES_11_8 = {
    ("p4d.24xlarge", "nvidia", None): "1ce1b3d60fe7",
    ("p5.48xlarge", "nvidia", None): "ba22aa690d79",
    ("p3.2xlarge", "nvidia", None): "6adc2fed974c",
    ("g5.xlarge", "mirror", None): "d44f820c4f1e",
    ("docker-node", "distro", None): "75c57c4422d1",
    ("p4d.24xlarge", "nvidia", "535"): "54b18eacd9fd",
}


@pytest.mark.parametrize(("key", "expected"), list(HASHES_11_8.items()))
def test_cuda_11_8_locks_keep_their_hash(key, expected) -> None:
    itype, source, driver = key
    lock = stack.resolve(itype, source=source, driver=driver, on=ON)
    assert lock.cuda == "11.8" and lock.short_hash() == expected
    assert stack.resolve(itype, cuda="11.8", source=source, driver=driver, on=ON).short_hash() == expected
    assert lock.public()["cuda_installable"] is True and lock.public()["cuda_release"] in ("11.8.0", "11.8.89")
    assert not any("does not install it yet" in n for n in lock.notes)


def test_the_leaf_list_of_lines_not_installed_is_the_data() -> None:
    assert cuda_lines.installable() == ["11.8"]
    assert list(NOT_INSTALLED_CUDA) == [n for n in cuda_lines.names() if not cuda_lines.is_installable(n)]
    # ... each with the sources that do install it (the leaf's copy of the data's)
    assert NOT_INSTALLED_CUDA == {n: tuple(cuda_lines.line(n).get("installable_sources", ()))
                                  for n in NOT_INSTALLED_CUDA}
    assert cuda_lines.is_installable("13.0", "mirror") and not cuda_lines.is_installable("13.0", "nvidia")
    assert not cuda_lines.is_installable("12.9", "mirror")
    assert cuda_lines.not_installed_yet("13.0", "g5.xlarge", "mirror") is None
    assert cuda_lines.not_installed_yet("13.0", "g5.xlarge", "nvidia").endswith(
        "install CUDA 11.8; it installs CUDA 13.0 with --source mirror")
    assert StackChoice(cuda="11.8").checked().cuda == "11.8"
    for line in ("12.9", "13.0"):
        with pytest.raises(BadInput, match=rf"--cuda {line}: gpuprov resolves this CUDA line but does not "
                                           r"install it yet"):
            StackChoice(cuda=line).checked()
    # A release the data lacks is the resolver's to refuse, with its rule.
    assert StackChoice(cuda="11.7").checked().cuda == "11.7"


def test_the_default_branch_search_holds_a_branch_to_the_lines_own_minimum() -> None:
    """The branch search (drivers._branch_fits) reads each locked line's minimum from the data,
    as resolution does: R575 serves 12.9 but not 13.0, R570 neither."""
    from gpuprov.lock import drivers

    assert drivers._branch_fits("575", "575.57.08", [], "12.9") is None
    assert drivers._branch_fits("575", "575.57.08", [], "13.0") == "CUDA 13.0 needs driver >= 580.95.05"
    assert drivers._branch_fits("570", "570.195.03", [], "12.9") == "CUDA 12.9 needs driver >= 575.57.08"
