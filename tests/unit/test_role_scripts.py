"""The helper programs gpu_preflight ships to nodes, run here for real."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

ROLES = Path(__file__).resolve().parents[2] / "roles"
PREFLIGHT_FILES = ROLES / "gpu_preflight" / "files"
BASE_FILES = ROLES / "gpuprov_base" / "files"


def _wait(locks: list[Path], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PREFLIGHT_FILES / "wait_dpkg_locks.py"), "--timeout", str(timeout),
         *map(str, locks)],
        capture_output=True, text=True, check=False, timeout=60,
    )


def test_wait_for_free_locks_returns_at_once(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    proc = _wait([lock, tmp_path / "missing-lock"], timeout=1)
    assert proc.returncode == 0, proc.stderr


def test_wait_for_held_lock_times_out_naming_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "lock-frontend"
    lock.touch()
    # A child holds a POSIX (fcntl) lock, as dpkg and apt do.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl,sys,time; f=open(sys.argv[1],'w'); fcntl.lockf(f, fcntl.LOCK_EX);"
         "print('locked', flush=True); time.sleep(30)", str(lock)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        proc = _wait([lock], timeout=1)
        assert proc.returncode == 3
        last = proc.stdout.strip().splitlines()[-1]
        assert f"pid {holder.pid}" in last and str(lock) in last and "still held" in last
    finally:
        holder.kill()
        holder.wait()
    # Released: free again, and the waiter never took the lock itself.
    assert _wait([lock], timeout=1).returncode == 0
    with open(lock, "w") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_gpu_fact_reads_this_machines_pci_bus() -> None:
    out = subprocess.run([sys.executable, str(BASE_FILES / "gpu.fact")], capture_output=True,
                         text=True, check=True)
    data = json.loads(out.stdout)
    nvidia = 0
    base = Path("/sys/bus/pci/devices")
    for dev in base.iterdir() if base.is_dir() else []:
        vendor = (dev / "vendor").read_text().strip()
        klass = (dev / "class").read_text().strip()
        if vendor == "0x10de" and klass.startswith(("0x0300", "0x0302")):
            nvidia += 1
    assert data["gpu_count"] == nvidia == len(data["gpus"])
    assert data["driver_loaded"] == os.path.isdir("/sys/module/nvidia")
