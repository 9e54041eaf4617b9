"""gpu_preflight's kernel_compiler.py names the compiler of the running kernel from /proc/version.

The banners are real ones, each with its source:
- Ubuntu 22.04 cloud kernels: NVIDIA/gpu-driver-container pull request 20, comment of
  2024-04-03 (https://github.com/NVIDIA/gpu-driver-container/pull/20), "The following kernel
  versions have been tested": 6.2 gcp with gcc-12, 6.5 aws with gcc-11, 5.15 generic and azure
  with plain gcc 11. (No 6.8 aws banner was found to quote; its compiler is printed the same
  way, x86_64-linux-gnu-gcc-12.)
- Ubuntu 18.04 aws (the pre-5.8 "gcc version" shape): aws-parallelcluster-cookbook pull request
  577 (https://github.com/aws/aws-parallelcluster-cookbook/pull/577).
- Debian 12: the banner of Debian's linux-image-6.1.0-31-amd64 as a Debian 12 machine's dmesg
  printed it (a public log found by code search; the same string as linux_proc_banner of that
  package).
- This project's test machine (`cat /proc/version`, 2026-11-24): a kernel built by plain gcc 15.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "gpu_preflight" / "files" / "kernel_compiler.py"
_spec = importlib.util.spec_from_file_location("kernel_compiler", SCRIPT)
kc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kc)

UBUNTU_2204_GCP_62 = ("Linux version 6.2.0-1019-gcp (buildd@lcy02-amd64-032) (x86_64-linux-gnu-gcc-12 "
                      "(Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) "
                      "#21~22.04.1-Ubuntu SMP Thu Nov 16 18:18:34 UTC 2023")
UBUNTU_2204_AWS_65 = ("Linux version 6.5.0-1014-aws (buildd@lcy02-amd64-032) (x86_64-linux-gnu-gcc-11 "
                      "(Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) "
                      "#14~22.04.1-Ubuntu SMP Thu Feb 15 15:27:06 UTC 2024")
UBUNTU_2204_GENERIC = ("Linux version 5.15.0-101-generic (buildd@lcy02-amd64-032) (gcc (Ubuntu "
                       "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #111-Ubuntu "
                       "SMP Tue Mar 5 20:16:58 UTC 2024")
UBUNTU_2204_AZURE = ("Linux version 5.15.0-1041-azure (buildd@lcy02-amd64-062) (gcc (Ubuntu "
                     "11.3.0-1ubuntu1~22.04.1) 11.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #48-Ubuntu "
                     "SMP Tue Jun 20 20:34:08 UTC 2023")
UBUNTU_1804_AWS = ("Linux version 4.15.0-1065-aws (buildd@lgw01-amd64-035) (gcc version 7.5.0 "
                   "(Ubuntu 7.5.0-3ubuntu1~18.04)) #69-Ubuntu SMP Thu Mar 26 02:17:29 UTC 2020")
DEBIAN_12 = ("Linux version 6.1.0-31-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14) "
             "12.2.0, GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1 (2025-02-07)")
TEST_MACHINE = ("Linux version 6.18.44-fc-v657 (builder@sandboxing) (gcc (GCC) 15.3.0, GNU ld "
                "(GNU Binutils) 2.46) #1 SMP PREEMPT_DYNAMIC @0")


@pytest.mark.parametrize(("banner", "package"), [
    (UBUNTU_2204_GCP_62, "gcc-12"),
    (UBUNTU_2204_AWS_65, "gcc-11"),
    (UBUNTU_2204_GENERIC, "gcc-11"),
    (UBUNTU_2204_AZURE, "gcc-11"),
    (UBUNTU_1804_AWS, "gcc-7"),
    (DEBIAN_12, "gcc-12"),
    (TEST_MACHINE, "gcc-15"),
])
def test_the_kernels_gcc_is_named(banner: str, package: str) -> None:
    got = kc.parse(banner)
    assert got["compiler"] == "gcc"
    assert got["package"] == package
    assert got["binary"] == f"/usr/bin/{package}"


def test_a_clang_built_kernel_names_no_package() -> None:
    # The shape clang-built kernels print (constructed here: no real banner is quoted).
    got = kc.parse("Linux version 6.8.0-1 (b@h) (Ubuntu clang version 18.1.3 (1ubuntu1), Ubuntu LLD 18.1.3) #1 SMP")
    assert got == {"compiler": "clang", "major": "18", "package": "", "binary": ""}


@pytest.mark.parametrize("bad", ["", "hello", "Linux version 6.1.0 (x@y) #1 SMP",
                                 "Linux version 6.1 (x) (gcc-12 (Debian 11.2.0-14) 11.2.0, GNU ld) #1"])
def test_unreadable_banners_are_refused(bad: str) -> None:
    with pytest.raises(kc.BannerError):
        kc.parse(bad)


def _run(tmp_path: Path, banner: str, default: str) -> subprocess.CompletedProcess[str]:
    proc = tmp_path / "version"
    proc.write_text(banner + "\n")
    return subprocess.run([sys.executable, str(SCRIPT), "--proc-version", str(proc), "--default-major", default],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize(("banner", "default", "differs"), [
    (DEBIAN_12, "12", False),            # Debian 12: the role does nothing extra
    (UBUNTU_2204_GCP_62, "11", True),    # Ubuntu 22.04 HWE/cloud kernel: install gcc-12 for DKMS
    (UBUNTU_2204_AWS_65, "11", False),
    (UBUNTU_2204_GCP_62, "", True),      # no gcc at all
])
def test_the_script_says_whether_dkms_needs_another_compiler(tmp_path, banner, default, differs) -> None:
    done = _run(tmp_path, banner, default)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["differs"] is differs
    assert out["default_major"] == default and out["banner"] == banner


def test_the_script_fails_with_one_line_on_a_bad_banner(tmp_path) -> None:
    done = _run(tmp_path, "not a banner", "12")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "kernel_compiler:" in done.stderr
