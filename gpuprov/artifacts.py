"""The artifact mirror: build NVIDIA's cuDNN redist archive from the PyPI wheel, and serve it.

An air-gapped site mirrors artifacts once and serves them inside; gpuprov's
demo and tests do the same on this machine. The cuDNN archive is rebuilt
byte for byte reproducibly (sorted entries, fixed owners and times, fixed xz
preset) from ``nvidia-cudnn-cu11`` (downloaded with its sha256 pinned), so
its sha256 can be pinned in the version lock.

    python -m gpuprov.artifacts build DIR       # DIR/cudnn/<archive>, DIR/SHA256SUMS
                                                # and each CUDA line's redist archives
                                                # (gpuprov/artifact_archives.py)
    python -m gpuprov.artifacts serve DIR --bind ADDR --port N
"""

from __future__ import annotations

import argparse
import io
import lzma
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from gpuprov import artifact_archives, stack
from gpuprov.artifact_archives import sha256

MTIME = 1700000000  # fixed, for reproducible archives


def fetch_wheel(cache: Path) -> Path:
    """The pinned cuDNN wheel, downloaded once (pip verifies the pinned sha256)."""
    cudnn = stack.data()["cudnn"]
    name, version = cudnn["wheel"].split("==")
    cache.mkdir(parents=True, exist_ok=True)
    for wheel in cache.glob(f"{name.replace('-', '_')}-{version}-*.whl"):
        if sha256(wheel) == cudnn["wheel_sha256"]:
            return wheel
        wheel.unlink()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        req.write(f"{cudnn['wheel']} --hash=sha256:{cudnn['wheel_sha256']}\n")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--require-hashes", "-r", req.name, "-d", str(cache)],
            check=True,
        )
    finally:
        os.unlink(req.name)
    (wheel,) = cache.glob(f"{name.replace('-', '_')}-{version}-*.whl")
    return wheel


def build_cudnn_archive(wheel: Path, out: Path) -> Path:
    """Repack the wheel into NVIDIA's redist layout: <top>/include, <top>/lib, <top>/LICENSE."""
    cudnn = stack.data()["cudnn"]
    archive = out / cudnn["archive"]
    top = cudnn["archive"].removesuffix(".tar.xz")
    full = cudnn["version"].rsplit(".", 1)[0]  # 8.9.6.50 -> 8.9.6 (the .so suffix)
    out.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".tmp")

    def add(tar: tarfile.TarFile, name: str, data: bytes | None = None, link: str | None = None,
            mode: int = 0o644) -> None:
        info = tarfile.TarInfo(f"{top}/{name}")
        info.mtime, info.uid, info.gid, info.uname, info.gname = MTIME, 0, 0, "root", "root"
        if link is not None:
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, link, 0o777
            tar.addfile(info)
            return
        assert data is not None
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))

    with zipfile.ZipFile(wheel) as whl, lzma.open(tmp, "wb", preset=1) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        names = sorted(whl.namelist())
        headers = [n for n in names if n.startswith("nvidia/cudnn/include/") and n.endswith(".h")]
        libs = [n for n in names if n.startswith("nvidia/cudnn/lib/") and ".so" in n]
        licence = next(n for n in names if n.endswith("License.txt"))
        add(tar, "LICENSE", whl.read(licence))
        for h in headers:
            add(tar, f"include/{Path(h).name}", whl.read(h))
        for lib in libs:
            soname = Path(lib).name  # libcudnn_x.so.8
            base = soname.split(".so")[0]
            add(tar, f"lib/{base}.so.{full}", whl.read(lib), mode=0o755)
            add(tar, f"lib/{base}.so.8", link=f"{base}.so.{full}")
            add(tar, f"lib/{base}.so", link=f"{base}.so.8")
    tmp.replace(archive)
    return archive


def build(directory: Path, wheel_cache: Path | None = None) -> dict[str, str]:
    wheel = fetch_wheel(wheel_cache or directory / "wheels")
    cudnn = stack.data()["cudnn"]
    archive = directory / "cudnn" / cudnn["archive"]
    if not archive.exists() or sha256(archive) != cudnn["archive_sha256"]:
        build_cudnn_archive(wheel, archive.parent)
    sums = {f"cudnn/{archive.name}": sha256(archive)}
    # The CUDA lines the mirror serves as NVIDIA's redist archives (data: [[cuda."X.Y".archives]]).
    sums.update(artifact_archives.build(directory, stack.data(), wheel_cache or directory / "wheels"))
    (directory / "SHA256SUMS").write_text("".join(f"{h}  {p}\n" for p, h in sums.items()))
    return sums


def serve(directory: Path, bind: str, port: int) -> None:
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    with http.server.ThreadingHTTPServer((bind, port), handler) as server:
        print(f"serving {directory} on http://{bind}:{port}/", flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuprov.artifacts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the mirror's artifacts into DIR")
    b.add_argument("directory", type=Path)
    b.add_argument("--wheel-cache", type=Path)
    s = sub.add_parser("serve", help="serve DIR over HTTP")
    s.add_argument("directory", type=Path)
    s.add_argument("--bind", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    if args.command == "build":
        sums = build(args.directory, args.wheel_cache)
        expected = stack.data()["cudnn"]["archive_sha256"]
        for path, digest in sums.items():
            print(f"{digest}  {path}")
        if sums[f"cudnn/{stack.data()['cudnn']['archive']}"] != expected:
            print(f"warning: the archive's sha256 differs from the lock's ({expected})",
                  file=sys.stderr)
            return 1
        wrong = artifact_archives.mismatches(sums, stack.data())
        for line in wrong:
            print(f"warning: {line}", file=sys.stderr)
        return 1 if wrong else 0
    serve(args.directory, args.bind, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
