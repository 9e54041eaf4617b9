"""The artifact mirror's CUDA line archives (gpuprov/artifact_archives.py): NVIDIA's redist
layout rebuilt from wheels, byte for byte the same each time, and the lock that pins them.

The wheels here are small zip files made by the test in the real wheels' layout (the member
names of nvidia-cuda-runtime 13.0.96 and nvidia-cudnn-cu13 9.17.1.4, with tiny contents): the
real ones, 650 MB, are rebuilt by `make mirror` and proven on a node by the cuda role's
`archives` molecule scenario."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest

from gpuprov import artifact_archives as aa
from gpuprov.lock import cuda_lines, stack


def wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


RUNTIME = {
    "nvidia/cu13/include/cuda_runtime.h": b"/* runtime */\n",
    "nvidia/cu13/lib/libcudart.so.13": b"\x7fELF runtime",
    "nvidia/cu13/lib/libcudart_static.a": b"!<arch>\n",
    "nvidia/cu13/.metadata/provenance.txt": b"build ids\n",
    "nvidia/__init__.py": b"",
    "nvidia_cuda_runtime-13.0.96.dist-info/licenses/License.txt": b"NVIDIA licence\n",
    "nvidia_cuda_runtime-13.0.96.dist-info/RECORD": b"",
}
NVCC = {
    "nvidia/cu13/bin/nvcc": b"#!nvcc",
    "nvidia/cu13/bin/nvcc.profile": b"TOP = $(_HERE_)/..\n",
    "nvidia/cu13/nvvm/bin/cicc": b"#!cicc",
    "nvidia_cuda_nvcc-13.0.88.dist-info/licenses/License.txt": b"NVIDIA licence\n",
}


def entries(path: Path) -> dict[str, tuple[str, int, str]]:
    with tarfile.open(path) as tar:
        return {m.name: ("link" if m.issym() else "file", m.mode, m.linkname) for m in tar.getmembers()}


def test_the_toolkit_layout_with_links_modes_and_nothing_of_the_wheel(tmp_path: Path) -> None:
    archive = {"component": "cuda_cudart", "archive": "cuda_cudart-linux-x86_64-13.0.96-archive.tar",
               "strip": "nvidia/cu13/"}
    out = aa.build_archive(archive, [wheel(tmp_path / "rt.whl", RUNTIME)], tmp_path / "out")
    top = "cuda_cudart-linux-x86_64-13.0.96-archive"
    assert entries(out) == {
        f"{top}/LICENSE": ("file", 0o644, ""),
        f"{top}/include/cuda_runtime.h": ("file", 0o644, ""),
        # lib/ -> lib64/ (nvcc.profile links from $(TOP)/lib64), with the linker's .so link
        f"{top}/lib64/libcudart.so": ("link", 0o777, "libcudart.so.13"),
        f"{top}/lib64/libcudart.so.13": ("file", 0o755, ""),
        f"{top}/lib64/libcudart_static.a": ("file", 0o644, ""),
    }


def test_programs_are_executable_and_wheels_merge_into_one_archive(tmp_path: Path) -> None:
    archive = {"component": "cuda_nvcc", "archive": "cuda_nvcc-x-archive.tar", "strip": "nvidia/cu13/"}
    out = aa.build_archive(archive, [wheel(tmp_path / "nvcc.whl", NVCC), wheel(tmp_path / "rt.whl", RUNTIME)],
                           tmp_path / "out")
    got = entries(out)
    assert got["cuda_nvcc-x-archive/bin/nvcc"][1] == 0o755
    assert got["cuda_nvcc-x-archive/nvvm/bin/cicc"][1] == 0o755
    assert got["cuda_nvcc-x-archive/bin/nvcc.profile"][1] == 0o644
    assert "cuda_nvcc-x-archive/include/cuda_runtime.h" in got


def test_cudnn_keeps_lib_as_nvidias_cudnn_archive_does(tmp_path: Path) -> None:
    members = {"nvidia/cudnn/lib/libcudnn.so.9": b"elf", "nvidia/cudnn/include/cudnn_version.h": b"#define\n",
               "nvidia_cudnn_cu13-9.17.1.4.dist-info/licenses/License.txt": b"l"}
    archive = {"component": "cudnn", "archive": "cudnn-x-archive.tar", "strip": "nvidia/cudnn/"}
    got = entries(aa.build_archive(archive, [wheel(tmp_path / "c.whl", members)], tmp_path / "out"))
    assert got["cudnn-x-archive/lib/libcudnn.so"] == ("link", 0o777, "libcudnn.so.9")


def test_the_same_wheels_give_the_same_bytes(tmp_path: Path) -> None:
    archive = {"component": "cuda_cudart", "archive": "a-archive.tar", "strip": "nvidia/cu13/"}
    w = wheel(tmp_path / "rt.whl", RUNTIME)
    first = aa.sha256(aa.build_archive(archive, [w], tmp_path / "one"))
    second = aa.sha256(aa.build_archive(archive, [w], tmp_path / "two"))
    assert first == second
    other = wheel(tmp_path / "rt2.whl", {**RUNTIME, "nvidia/cu13/include/cuda_runtime.h": b"/* changed */\n"})
    assert aa.sha256(aa.build_archive(archive, [other], tmp_path / "three")) != first


def test_refusals(tmp_path: Path) -> None:
    w = wheel(tmp_path / "rt.whl", RUNTIME)
    with pytest.raises(ValueError, match=r"plain \.tar"):
        aa.build_archive({"component": "cuda_cudart", "archive": "a.tar.xz", "strip": "nvidia/cu13/"}, [w], tmp_path)
    with pytest.raises(ValueError, match="no file of its wheels"):
        aa.build_archive({"component": "nccl", "archive": "n.tar", "strip": "nvidia/nccl/"}, [w], tmp_path)
    with pytest.raises(ValueError, match="in both"):
        aa.build_archive({"component": "cuda_cudart", "archive": "a.tar", "strip": "nvidia/cu13/"},
                         [w, wheel(tmp_path / "again.whl", RUNTIME)], tmp_path)
    for pin in ("nvidia-cuda-runtime==13.0.96", "nvidia-cuda-runtime>=13 --hash=sha256:" + "0" * 64,
                "x==1 --hash=sha256:" + "0" * 63 + "; rm -rf /"):
        with pytest.raises(ValueError, match="expected 'NAME==VERSION"):
            aa._pin(pin)


def test_a_cached_wheel_that_is_not_the_pinned_one_is_dropped(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cache").mkdir()
    good = wheel(tmp_path / "cache" / "nvidia_cuda_runtime-13.0.96-py3-none-any.whl", RUNTIME)
    archive = {"wheels": [f"nvidia-cuda-runtime==13.0.96 --hash=sha256:{aa.sha256(good)}"]}
    calls = []
    monkeypatch.setattr(aa.subprocess, "run", lambda argv, **kw: calls.append(argv))
    assert aa.fetch_wheels(archive, tmp_path / "cache") == [good]  # found and checked: pip not asked
    assert calls == []
    good.write_bytes(b"tampered")
    # pip (stubbed: it brings nothing) is asked for exactly the pinned wheel, and nothing else is used
    with pytest.raises(RuntimeError, match=r"no wheel with the pinned sha256 for nvidia-cuda-runtime==13\.0\.96"):
        aa.fetch_wheels(archive, tmp_path / "cache")
    assert not good.exists()  # the tampered copy was removed before pip was asked
    assert len(calls) == 1 and "--require-hashes" in calls[0]


def test_the_data_pins_every_archive_and_the_mirror_rebuilds_those_bytes() -> None:
    """Every line archive names its wheels with their sha256 and its own sha256 (what `make
    mirror` checks: a rebuild that differs is a failed set-up)."""
    archives = aa.all_archives(stack.data())
    assert {a["component"] for a in archives} == {"cuda_nvcc", "cuda_cudart", "cuda_cccl", "nccl", "cudnn"}
    for a in archives:
        assert len(a["archive_sha256"]) == 64, a
        assert all(aa._pin(w) for w in a["wheels"])
        assert a["archive"].endswith(".tar")
    sums = {f"{aa.subdir(a)}/{a['archive']}": a["archive_sha256"] for a in archives}
    assert aa.mismatches(sums, stack.data()) == []
    wrong = dict(sums, **{next(iter(sums)): "0" * 64})
    assert aa.mismatches(wrong, stack.data()) == [f"{next(iter(sums))}: built {'0' * 64}, pinned {sums[next(iter(sums))]}"]


def test_cuda_13_of_source_mirror_pins_the_archives_and_11_8_locks_keep_their_hash() -> None:
    lock = stack.resolve(None, cuda="13", source="mirror").as_dict()
    assert lock["packages"]["cuda_method"] == "archives"
    assert [a["component"] for a in lock["cuda_archives"]] == ["cuda_nvcc", "cuda_cudart", "cuda_cccl", "nccl"]
    assert lock["cudnn_archive"] == "cudnn-linux-x86_64-9.17.1.4_cuda13-archive.tar"
    assert lock["cudnn_archive_sha256"] == next(a["archive_sha256"] for a in aa.line_archives("13.0", stack.data())
                                                if a["component"] == "cudnn")
    assert stack.from_dict(lock).short_hash() == lock["hash"]
    assert cuda_lines.own_archives("11.8") == []
    for source in ("distro", "nvidia", "mirror"):
        old = stack.resolve(None, source=source)
        assert old.cuda_archives == () and "cuda_method" not in old.packages
        body = {k: v for k, v in old.as_dict().items() if k not in ("hash", "cuda_archives")}
        assert stack.from_dict(body).short_hash() == old.short_hash()  # a lock stored before: same hash


def test_the_demo_builds_only_its_locks_artifacts(tmp_path: Path, monkeypatch) -> None:
    """`make demo` (GPUPROV_MIRROR_LINES=default) builds the artifacts of the demo's lock alone:
    11.8's cuDNN 8.9, no CUDA 13 or cuDNN 9 archive; a later build of every line adds them, and
    SHA256SUMS lists what is there from both."""
    from gpuprov import artifacts

    assert artifacts.lines_of("default") == frozenset({"11.8"})
    assert artifacts.lines_of("all") is None and artifacts.lines_of("13.0,11.8") == frozenset({"11.8", "13.0"})
    with pytest.raises(SystemExit, match=r"--lines 7\.5: expected all, default or CUDA lines of"):
        artifacts.lines_of("7.5")
    built: list[str] = []

    def fake_archive(archive, wheels, out):
        out.mkdir(parents=True, exist_ok=True)
        (out / archive["archive"]).write_bytes(archive["archive"].encode())
        built.append(archive["archive"])

    def fake_cudnn(wheel, out):
        out.mkdir(parents=True, exist_ok=True)
        (out / stack.data()["cudnn"]["archive"]).write_bytes(b"cudnn8")
        built.append("cudnn8")

    monkeypatch.setattr(artifacts, "fetch_wheel", lambda cache: cache / "w.whl")
    monkeypatch.setattr(artifacts, "build_cudnn_archive", fake_cudnn)
    monkeypatch.setattr(aa, "fetch_wheels", lambda archive, cache: [])
    monkeypatch.setattr(aa, "build_archive", fake_archive)
    sums = artifacts.build(tmp_path, lines=artifacts.lines_of("default"))
    assert built == ["cudnn8"] and list(sums) == [f"cudnn/{stack.data()['cudnn']['archive']}"]
    assert aa.mismatches(sums, stack.data()) == []  # the lines not built are not mismatches
    artifacts.build(tmp_path, lines=frozenset({"13.0"}))
    assert len(built) == 1 + len(aa.line_archives("13.0", stack.data()))
    listed = (tmp_path / "SHA256SUMS").read_text()
    assert stack.data()["cudnn"]["archive"] in listed and "cuda_nvcc" in listed
