#!/usr/bin/python3
"""Which compiler built the running kernel, and whether DKMS needs it (gpuprov, gpu_preflight).

Out-of-tree modules (nvidia, gdrdrv, efa) must be built with the compiler the kernel was built
with: Ubuntu 22.04's 6.x cloud kernels are built with gcc-12 while build-essential installs
gcc-11, and gcc-11 rejects the kernel's -ftrivial-auto-var-init=zero (NVIDIA/gpu-driver-container
PR 20, aws-parallelcluster-cookbook issue 2852). /proc/version names that compiler; this script
reads it and the default `gcc`'s major version and prints one JSON object:

  {"compiler": "gcc", "major": "12", "package": "gcc-12", "binary": "/usr/bin/gcc-12",
   "default_major": "11", "differs": true, "banner": "..."}

"package" is empty when the kernel was not built by a GCC this can name (clang): then nothing
is done. Exit 2 with one line when the banner cannot be read at all.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys

# The compiler in the banner, in the shapes kernels print it (newest first):
#   (gcc-12 (Debian 12.2.0-14) 12.2.0, GNU ld ...)                        Debian 12
#   (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0, ...)  Ubuntu HWE/cloud
#   (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld ...)               Ubuntu GA
#   (gcc version 7.5.0 (Ubuntu 7.5.0-3ubuntu1~18.04))                     kernels before 5.8
#   (Ubuntu clang version 18.1.3 (1ubuntu1), Ubuntu LLD 18.1.3)           clang-built
_GCC = re.compile(
    r"\((?:[a-z0-9_]+-linux-gnu-)?gcc(?:-(?P<suffix>\d+))?"
    r"(?: \((?P<vendor>[^()]*)\))? (?:version )?(?P<version>\d+)\.\d+(?:\.\d+)?")
_CLANG = re.compile(r"\((?:[A-Za-z]+ )?clang version (?P<version>\d+)\.")


class BannerError(ValueError):
    pass


def parse(banner: str) -> dict[str, str]:
    """The compiler of a /proc/version banner: {"compiler", "major", "package", "binary"}."""
    if not banner.startswith("Linux version "):
        raise BannerError(f"not a /proc/version banner: {banner[:60]!r}")
    gcc = _GCC.search(banner)
    if gcc:
        major = gcc.group("suffix") or gcc.group("version")
        if gcc.group("suffix") and gcc.group("suffix") != gcc.group("version"):
            raise BannerError(f"gcc-{gcc.group('suffix')} reports version {gcc.group('version')}: {banner[:120]!r}")
        return {"compiler": "gcc", "major": major, "package": f"gcc-{major}", "binary": f"/usr/bin/gcc-{major}"}
    clang = _CLANG.search(banner)
    if clang:
        return {"compiler": "clang", "major": clang.group("version"), "package": "", "binary": ""}
    raise BannerError(f"no compiler named in the banner: {banner[:120]!r}")


def default_gcc_major() -> str:
    """The major version of the `gcc` on PATH ("" when there is none)."""
    if shutil.which("gcc") is None:
        return ""
    out = subprocess.run(["gcc", "-dumpversion"], capture_output=True, text=True, check=False).stdout
    return out.strip().split(".")[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proc-version", default="/proc/version", help="the banner's file")
    ap.add_argument("--default-major", default=None, help="the default gcc's major version (read from gcc)")
    args = ap.parse_args(argv)
    try:
        with open(args.proc_version, encoding="utf-8", errors="replace") as fh:
            banner = fh.read().strip()
        found = parse(banner)
    except (OSError, BannerError) as exc:
        print(f"kernel_compiler: {exc}", file=sys.stderr)
        return 2
    default = default_gcc_major() if args.default_major is None else args.default_major
    found.update(default_major=default, banner=banner,
                 differs=bool(found["package"]) and found["major"] != default)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
