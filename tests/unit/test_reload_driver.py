"""roles/node_patch/files/reload_driver.sh, run for real with bash against a FIXTURE node.

The script stops the services that hold the GPU, refuses to unload while anything uses the
driver, unloads and loads the NVIDIA modules in dependency order and starts the services
again. Here it runs with FIXTURE shims first on PATH (systemctl, rmmod, modprobe: tiny
scripts that record each call and act on the fixture tree) and a FIXTURE sysfs/proc tree
given through the script's test knob RELOAD_DRIVER_TEST_ROOT. This machine has no NVIDIA GPU:
the real path (a module really unloaded and loaded) needs a GPU host and is not run here.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "roles" / "node_patch" / "files" / "reload_driver.sh"
OLD, NEW = "535.309.01", "580.159.04"

# FIXTURE shims. Each records "NAME ARGS" in $FIXTURE_LOG. rmmod and modprobe remove and
# create the module's directory under the fixture sysfs (modprobe nvidia writes
# $FIXTURE_NEW_VERSION); $FIXTURE_RMMOD_FAIL names a module rmmod refuses, as the kernel does
# for a module in use. systemctl keeps the active units in $FIXTURE_ACTIVE (one a line).
SHIMS = {
    "systemctl": r"""#!/bin/bash
# FIXTURE systemctl (tests/unit/test_reload_driver.py): records its calls, no systemd.
echo "systemctl $*" >> "$FIXTURE_LOG"
case "$1" in
  is-active) grep -qx "$3" "$FIXTURE_ACTIVE" ;;
  stop)
    if [ "${FIXTURE_STOP_FAIL:-}" = "$2" ]; then echo "Job for $2 failed" >&2; exit 1; fi
    grep -vx "$2" "$FIXTURE_ACTIVE" > "$FIXTURE_ACTIVE.new" || true
    mv "$FIXTURE_ACTIVE.new" "$FIXTURE_ACTIVE" ;;
  start) echo "$2" >> "$FIXTURE_ACTIVE" ;;
esac
""",
    "rmmod": r"""#!/bin/bash
# FIXTURE rmmod (tests/unit/test_reload_driver.py): records its calls, unloads nothing.
echo "rmmod $*" >> "$FIXTURE_LOG"
if [ "${FIXTURE_RMMOD_FAIL:-}" = "$1" ]; then
  echo "rmmod: ERROR: Module $1 is in use" >&2
  exit 1
fi
rm -rf "$RELOAD_DRIVER_TEST_ROOT/sys/module/$1"
""",
    "modprobe": r"""#!/bin/bash
# FIXTURE modprobe (tests/unit/test_reload_driver.py): records its calls, loads nothing.
echo "modprobe $*" >> "$FIXTURE_LOG"
mkdir -p "$RELOAD_DRIVER_TEST_ROOT/sys/module/$1"
echo 0 > "$RELOAD_DRIVER_TEST_ROOT/sys/module/$1/refcnt"
if [ "$1" = nvidia ]; then
  echo "$FIXTURE_NEW_VERSION" > "$RELOAD_DRIVER_TEST_ROOT/sys/module/nvidia/version"
fi
""",
}

# A GPU node's usual modules (lsmod): nvidia used by nvidia_uvm and nvidia_modeset,
# nvidia_modeset by nvidia_drm.
STACK = {
    "nvidia": (2, ["nvidia_uvm", "nvidia_modeset"]),
    "nvidia_modeset": (1, ["nvidia_drm"]),
    "nvidia_uvm": (0, []),
    "nvidia_drm": (0, []),
}


class Node:
    """A FIXTURE node: sysfs modules, /proc, active units, the shims and their call log."""

    def __init__(self, tmp_path: Path, modules: dict[str, tuple[int, list[str]]],
                 active: list[str], version: str = OLD) -> None:
        self.root = tmp_path / "root"
        self.log = tmp_path / "calls.log"
        self.active = tmp_path / "active"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name, text in SHIMS.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        for name, (refcnt, holders) in modules.items():
            moddir = self.root / "sys" / "module" / name
            (moddir / "holders").mkdir(parents=True)
            (moddir / "refcnt").write_text(f"{refcnt}\n")
            for holder in holders:
                (moddir / "holders" / holder).symlink_to(f"../../{holder}")
        if "nvidia" in modules:
            (self.root / "sys" / "module" / "nvidia" / "version").write_text(version + "\n")
        (self.root / "proc").mkdir(parents=True)
        # A process with no NVIDIA device open, which must not count.
        self.process(1, "systemd", "/dev/null")
        self.active.write_text("".join(f"{unit}\n" for unit in active))
        self.log.write_text("")

    def process(self, pid: int, name: str, *targets: str) -> None:
        fds = self.root / "proc" / str(pid) / "fd"
        fds.mkdir(parents=True)
        (fds.parent / "comm").write_text(name + "\n")
        for number, target in enumerate(targets):
            (fds / str(number)).symlink_to(target)

    def run(self, *args: str, **env: str) -> tuple[dict[str, str], list[str]]:
        environ = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                   "RELOAD_DRIVER_TEST_ROOT": str(self.root), "FIXTURE_LOG": str(self.log),
                   "FIXTURE_ACTIVE": str(self.active), "FIXTURE_NEW_VERSION": NEW, **env}
        proc = subprocess.run(["bash", str(SCRIPT), *args], env=environ, capture_output=True,
                              text=True, check=False, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        return out, self.log.read_text().splitlines()


def _unit_calls(calls: list[str], verb: str) -> list[str]:
    return [c.split()[2] for c in calls if c.startswith(f"systemctl {verb} ")]


def test_free_modules_are_unloaded_in_order_loaded_and_services_restarted(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=["nvidia-persistenced", "nvidia-dcgm"])
    out, calls = node.run(NEW)
    assert out["reloaded"] == "yes", out
    assert out["before"] == OLD and out["loaded"] == NEW and out["reason"] == ""
    module_calls = [c for c in calls if not c.startswith("systemctl")]
    assert module_calls == [
        "rmmod nvidia_uvm", "rmmod nvidia_drm", "rmmod nvidia_modeset", "rmmod nvidia",
        "modprobe nvidia", "modprobe nvidia_modeset", "modprobe nvidia_drm", "modprobe nvidia_uvm",
    ]
    assert _unit_calls(calls, "stop") == ["nvidia-persistenced", "nvidia-dcgm"]
    assert _unit_calls(calls, "start") == ["nvidia-persistenced", "nvidia-dcgm"]
    # Stopped before the first rmmod, started after the last modprobe.
    assert calls.index("systemctl stop nvidia-dcgm") < calls.index("rmmod nvidia_uvm")
    assert calls.index("modprobe nvidia_uvm") < calls.index("systemctl start nvidia-persistenced")
    assert out["stopped"] == out["restarted"] == "nvidia-persistenced,nvidia-dcgm"
    assert "restart_failed" not in out
    # Units that were not running are neither stopped nor started.
    assert "systemctl stop nvidia-fabricmanager" not in calls
    assert "systemctl start nvidia-fabricmanager" not in calls


def test_peermem_goes_first_and_comes_back(tmp_path: Path) -> None:
    modules = {**STACK, "nvidia": (3, ["nvidia_uvm", "nvidia_modeset", "nvidia_peermem"]),
               "nvidia_peermem": (0, [])}
    node = Node(tmp_path, modules, active=["nvidia-fabricmanager"])
    out, calls = node.run(NEW)
    assert out["reloaded"] == "yes", out
    rmmods = [c for c in calls if c.startswith("rmmod")]
    assert rmmods[0] == "rmmod nvidia_peermem" and rmmods[-1] == "rmmod nvidia"
    assert [c for c in calls if c.startswith("modprobe")][-1] == "modprobe nvidia_peermem"
    assert _unit_calls(calls, "start") == ["nvidia-fabricmanager"]


def test_a_process_holding_a_device_blocks_the_unload_and_is_named(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=["nvidia-persistenced"])
    node.process(4242, "python3", "/dev/null", "/dev/nvidia0", "/dev/nvidiactl")
    out, calls = node.run(NEW)
    assert out["reloaded"] == "no"
    assert out["holders"] == "4242:python3"
    assert "4242:python3" in out["reason"] and "not unloaded" in out["reason"]
    assert out["loaded"] == OLD
    assert not [c for c in calls if c.startswith(("rmmod", "modprobe"))], calls
    assert _unit_calls(calls, "stop") == _unit_calls(calls, "start") == ["nvidia-persistenced"]


def test_rmmod_refusing_nvidia_drm_stops_with_the_reason_and_restarts_services(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=["nvidia-persistenced", "nvidia-fabricmanager"])
    out, calls = node.run(NEW, FIXTURE_RMMOD_FAIL="nvidia_drm")
    assert out["reloaded"] == "no"
    assert out["reason"].startswith("rmmod nvidia_drm failed: rmmod: ERROR: Module nvidia_drm is in use")
    assert "display" in out["reason"]
    module_calls = [c for c in calls if not c.startswith("systemctl")]
    # nvidia_uvm, already out, is loaded again; nvidia_modeset and nvidia are never touched.
    assert module_calls == ["rmmod nvidia_uvm", "rmmod nvidia_drm", "modprobe nvidia_uvm"]
    assert out["loaded"] == OLD
    assert _unit_calls(calls, "start") == ["nvidia-persistenced", "nvidia-fabricmanager"]


def test_nothing_loaded_loads_nvidia(tmp_path: Path) -> None:
    node = Node(tmp_path, {}, active=[])
    out, calls = node.run(NEW)
    assert out["before"] == "" and out["loaded"] == NEW and out["reloaded"] == "yes", out
    assert [c for c in calls if not c.startswith("systemctl is-active")] == ["modprobe nvidia"]
    assert out["stopped"] == out["restarted"] == ""


def test_a_display_on_nvidia_drm_is_reported_and_nothing_unloaded(tmp_path: Path) -> None:
    # nvidia_drm used with no module holding it: a console or display server on it.
    node = Node(tmp_path, {**STACK, "nvidia_drm": (1, [])}, active=["nvidia-persistenced"])
    out, calls = node.run(NEW)
    assert out["reloaded"] == "no"
    assert out["reason"].startswith("nvidia_drm is in use (refcnt 1, 0 from")
    assert "display or console" in out["reason"]
    assert not [c for c in calls if c.startswith(("rmmod", "modprobe"))], calls
    assert _unit_calls(calls, "start") == ["nvidia-persistenced"]


def test_a_foreign_module_on_nvidia_is_named(tmp_path: Path) -> None:
    # GDRCopy's gdrdrv depends on nvidia: the script must not try to pull nvidia from under it.
    node = Node(tmp_path, {**STACK, "nvidia": (3, ["nvidia_uvm", "nvidia_modeset", "gdrdrv"])}, active=[])
    out, calls = node.run(NEW)
    assert out["reloaded"] == "no"
    assert out["reason"] == "nvidia is used by module gdrdrv; not unloaded"
    assert not [c for c in calls if c.startswith(("rmmod", "modprobe"))], calls


def test_a_service_that_will_not_stop_leaves_the_modules_alone(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=["nvidia-persistenced", "nvidia-dcgm"])
    out, calls = node.run(NEW, FIXTURE_STOP_FAIL="nvidia-dcgm")
    assert out["reloaded"] == "no" and out["reason"].startswith("could not stop nvidia-dcgm")
    assert not [c for c in calls if c.startswith(("rmmod", "modprobe"))], calls
    # The one it did stop runs again.
    assert _unit_calls(calls, "start") == ["nvidia-persistenced"]


def test_the_old_module_coming_back_is_not_a_reload(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=[])
    out, _ = node.run(NEW, FIXTURE_NEW_VERSION=OLD)
    assert out["reloaded"] == "no" and out["loaded"] == OLD
    assert out["reason"] == f"driver {OLD} loaded after the reload, not {NEW} (the module on disk is not the lock's)"


def test_the_wanted_driver_already_loaded_touches_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, STACK, active=["nvidia-persistenced"])
    out, calls = node.run(OLD)
    assert out["reloaded"] == "no" and out["reason"] == f"driver {OLD} is already loaded"
    assert calls == []
