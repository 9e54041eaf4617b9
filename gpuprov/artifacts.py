"""The artifact mirror: build NVIDIA's cuDNN redist archive from the PyPI wheel, and serve it.

An air-gapped site mirrors artifacts once and serves them inside; gpuprov's
demo and tests do the same on this machine. The cuDNN archive is rebuilt
byte for byte reproducibly (sorted entries, fixed owners and times; a plain tar, as the line
archives of gpuprov/artifact_archives.py are) from ``nvidia-cudnn-cu11`` (downloaded with its
sha256 pinned), so its sha256 can be pinned in the version lock. NVIDIA's own download is a
.tar.xz; xz at preset 1 took eight minutes of one core of a 2-core AMD EPYC (1063 MiB to
489), and a node that unpacks it three decompressions of 40 CPU-seconds each: a plain tar costs
neither, and its bytes depend on no compressor's version.

    python -m gpuprov.artifacts build DIR       # DIR/cudnn/<archive>, DIR/SHA256SUMS
                                                # and each CUDA line's redist archives
                                                # (gpuprov/artifact_archives.py)
    python -m gpuprov.artifacts build DIR --background LOG   # the same, detached
    python -m gpuprov.artifacts serve DIR --bind ADDR --port N

A build in progress names what it will write in DIR/.building (its pid and those paths), written
before it starts; the server holds a request for such a path until it is there (up to HOLD_S, then
503 with Retry-After: a node's download retries), so that a machine serves while it builds: the
first node's bootstrap reaches cuDNN minutes after it starts, while the archives are still
being packed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from gpuprov import artifact_archives
from gpuprov.artifact_archives import sha256
from gpuprov.lock import stack

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
    top = cudnn["archive"].removesuffix(".tar")
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

    with zipfile.ZipFile(wheel) as whl, tarfile.open(tmp, mode="w", format=tarfile.GNU_FORMAT) as tar:
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


BUILDING = ".building"  # {"pid": N, "paths": [relative paths a build in progress will write]}
HOLD_S = 100  # under the roles' get_url timeout (120 s): past it, 503 and the node retries


def wanted(directory: Path, lines: frozenset[str] | None = None) -> dict[str, str]:
    """What a build of ``lines`` (None: every line) puts in ``directory``: {relative path: the
    pinned sha256}, the line archives first, the cuDNN 8.9 archive last."""
    cudnn = stack.data()["cudnn"]
    chosen = sorted(stack.data().get("cuda", {})) if lines is None else sorted(lines)
    out = {f"{artifact_archives.subdir(a)}/{a['archive']}": a.get("archive_sha256", "")
           for line in chosen for a in artifact_archives.line_archives(line, stack.data())}
    if lines is None or any(line.split(".")[0] == cudnn["for_cuda"] for line in lines):
        out[f"cudnn/{cudnn['archive']}"] = cudnn["archive_sha256"]
    return out


def missing(directory: Path, lines: frozenset[str] | None = None) -> list[str]:
    """The paths of ``wanted`` not there with their pinned bytes."""
    return [rel for rel, digest in wanted(directory, lines).items()
            if not (directory / rel).is_file() or sha256(directory / rel) != digest]


def _mark(directory: Path, paths: list[str]) -> None:
    marker = directory / BUILDING
    if not paths:
        marker.unlink(missing_ok=True)
        return
    tmp = marker.with_suffix(f".{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "paths": paths}))
    tmp.replace(marker)


def building(directory: Path) -> set[str]:
    """The paths a build still running will write (none when no build runs: its pid gone)."""
    try:
        record = json.loads((directory / BUILDING).read_text())
        os.kill(int(record["pid"]), 0)
        return {str(p) for p in record["paths"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def build(directory: Path, wheel_cache: Path | None = None, lines: frozenset[str] | None = None) -> dict[str, str]:
    """Every artifact the data names, or with ``lines`` those of these CUDA lines alone (the
    cuDNN archive of [cudnn] is its CUDA major's: 11.8's). SHA256SUMS lists what is there;
    DIR/.building what is still to come while this runs."""
    cudnn = stack.data()["cudnn"]
    directory.mkdir(parents=True, exist_ok=True)
    todo = missing(directory, lines)
    _mark(directory, todo)
    try:
        # The CUDA lines the mirror serves as NVIDIA's redist archives (data: [[cuda."X.Y".archives]]).
        sums = artifact_archives.build(directory, stack.data(), wheel_cache or directory / "wheels", lines)
        todo = [rel for rel in todo if rel not in sums]
        _mark(directory, todo)
        if f"cudnn/{cudnn['archive']}" in wanted(directory, lines):
            wheel = fetch_wheel(wheel_cache or directory / "wheels")
            archive = directory / "cudnn" / cudnn["archive"]
            if not archive.exists() or sha256(archive) != cudnn["archive_sha256"]:
                build_cudnn_archive(wheel, archive.parent)
            sums[f"cudnn/{archive.name}"] = sha256(archive)
    finally:
        _mark(directory, [])
    listed = directory / "SHA256SUMS"
    kept = {}  # what an earlier build of other lines left, while its file is still there
    if lines is not None and listed.exists():
        for row in listed.read_text().splitlines():
            digest, _, path = row.partition("  ")
            if path and path not in sums and (directory / path).is_file():
                kept[path] = digest
    listed.write_text("".join(f"{h}  {p}\n" for p, h in sorted({**kept, **sums}.items())))
    return sums


def lines_of(words: str) -> frozenset[str] | None:
    """``--lines``: "all" (every line the data names), "default" (the line of the lock a docker
    node of Debian 12 resolves, the demo's), or CUDA lines separated by commas."""
    if words == "all":
        return None
    if words == "default":
        return frozenset({stack.resolve(None, source="distro").cuda})
    known = set(stack.data()["cuda"])
    chosen = frozenset(w.strip() for w in words.split(",") if w.strip())
    unknown = sorted(chosen - known)
    if unknown or not chosen:
        raise SystemExit(f"--lines {words}: expected all, default or CUDA lines of {', '.join(sorted(known))}")
    return chosen


def wait_for(directory: Path, rel: str, hold_s: float = HOLD_S) -> bool:
    """Hold a request for ``rel`` while a running build will write it: True once it is there or
    no build will write it, False when ``hold_s`` ran out first."""
    until = time.monotonic() + hold_s
    # A file that is there is whole (a build writes beside it and renames): never held.
    while rel in building(directory) and not (directory / rel).is_file():
        if time.monotonic() > until:
            return False
        time.sleep(1)
    return True


def handler_class(directory: Path, hold_s: float = HOLD_S) -> type:
    import http.server

    root = directory.resolve()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def send_head(self) -> Any:
            path = Path(self.translate_path(self.path)).resolve()
            if path.is_relative_to(root) and not wait_for(root, path.relative_to(root).as_posix(), hold_s):
                self.send_response(503, "still being built")
                self.send_header("Retry-After", "5")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return super().send_head()

    return Handler


def serve(directory: Path, bind: str, port: int) -> None:
    import http.server

    with http.server.ThreadingHTTPServer((bind, port), handler_class(directory)) as server:
        print(f"serving {directory} on http://{bind}:{port}/", flush=True)
        server.serve_forever()


def background(directory: Path, wheel_cache: Path | None, words: str, log: Path) -> int:
    """Mark what is missing (so that the server holds requests for it from now on), then build it
    in a process of its own; prints what it started."""
    lines = lines_of(words)
    directory.mkdir(parents=True, exist_ok=True)
    todo = missing(directory, lines)
    if not todo:
        if not building(directory):
            _mark(directory, [])  # a marker a killed build left
        print("nothing to build")
        return 0
    argv = [sys.executable, "-m", "gpuprov.artifacts", "build", str(directory), "--lines", words]
    if wheel_cache is not None:
        argv += ["--wheel-cache", str(wheel_cache)]
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    # The child marks the same paths under its own pid when it starts; mark them under that pid
    # now, so that no request comes between (a marker left by a child that already ended names a
    # pid that is gone: nothing is held for it).
    (directory / BUILDING).write_text(json.dumps({"pid": proc.pid, "paths": todo}))
    print(f"building {len(todo)} artifact(s) in the background (pid {proc.pid}, log {log}): {', '.join(todo)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuprov.artifacts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the mirror's artifacts into DIR")
    b.add_argument("directory", type=Path)
    b.add_argument("--wheel-cache", type=Path)
    b.add_argument("--lines", default="all", help="all (default), default (the demo's lock), or CUDA lines: 11.8,13.0")
    b.add_argument("--background", type=Path, metavar="LOG",
                   help="mark what is missing, then build it detached, its output to LOG")
    s = sub.add_parser("serve", help="serve DIR over HTTP")
    s.add_argument("directory", type=Path)
    s.add_argument("--bind", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8089)
    args = parser.parse_args(argv)
    if args.command == "build" and args.background is not None:
        return background(args.directory, args.wheel_cache, args.lines, args.background)
    if args.command == "build":
        sums = build(args.directory, args.wheel_cache, lines_of(args.lines))
        expected = stack.data()["cudnn"]["archive_sha256"]
        for path, digest in sums.items():
            print(f"{digest}  {path}")
        if sums.get(f"cudnn/{stack.data()['cudnn']['archive']}", expected) != expected:
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
