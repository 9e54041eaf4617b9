#!/bin/bash
# gpuprov node_patch: load a moved NVIDIA driver without a reboot, where its kernel modules
# can be reloaded. Run after the driver packages moved, on a node with GPUs that is not a
# container. Argument: the release that should run (the lock's), optional.
#
# 1. Stops the services that hold the GPU and are running (persistence daemon, fabric
#    manager, DCGM host engine); they are started again at the end, whatever happened.
# 2. Unloads nothing while a process still has /dev/nvidia* open (named), or while a module
#    is used beyond the NVIDIA modules unloaded with it (/sys/module/M/refcnt against
#    /sys/module/M/holders: a display or console on nvidia_drm, GDRCopy's gdrdrv on nvidia).
#    The same check as NVIDIA's driver container before it unloads (NVIDIA/gpu-driver-container,
#    ubuntu22.04/nvidia-driver, _unload_driver: refcnt of nvidia against its dependent modules).
# 3. Unloads nvidia_peermem, nvidia_uvm, nvidia_drm, nvidia_modeset, nvidia (those loaded, in
#    that order: each one before the module it depends on), then loads nvidia and the others
#    that were loaded. Nothing else about the GPUs is changed (no reset, no clocks, no modes).
#
# Prints key=value lines: before, stopped, holders (pid:name, when some), unloaded, probed,
# restarted, restart_failed (when some), reloaded (yes|no), reason (why not), loaded (the
# version running now, empty when none).
#
# Test knob: RELOAD_DRIVER_TEST_ROOT (default /) is where sys/module and proc are read, so
# tests/unit/test_reload_driver.py can run this against a FIXTURE tree; never set on a node.
set -euo pipefail
shopt -s nullglob

root="${RELOAD_DRIVER_TEST_ROOT:-/}"
root="${root%/}"
modules_dir="$root/sys/module"
proc="$root/proc"
want="${1:-}"

# Units that keep /dev/nvidia* open while they run: nvidia-persistenced (NVIDIA driver
# documentation, "Driver Persistence"), nvidia-fabricmanager (NVIDIA Fabric Manager User
# Guide), nvidia-dcgm (DCGM User Guide; dcgm in DCGM before 3.0, nv-hostengine by hand), and
# the dcgm role's gpuprov-dcgm-exporter (its container holds the GPUs' device files).
# Started again in this order.
services=(nvidia-persistenced nvidia-fabricmanager nvidia-dcgm dcgm nv-hostengine gpuprov-dcgm-exporter)
# Each module before the one it depends on (modinfo -F depends).
modules=(nvidia_peermem nvidia_uvm nvidia_drm nvidia_modeset nvidia)

stopped=()
unloaded=()
probed=()
reloaded=no
reason=""

join() {
  local IFS=,
  echo "$*"
}
version() { cat "$modules_dir/nvidia/version" 2>/dev/null || true; }
is_loaded() { [ -d "$modules_dir/$1" ]; }
first_line() { printf '%s' "${1%%$'\n'*}"; }

finish() {
  local rc=$? unit restarted=() failed=()
  set +e
  trap - EXIT
  if [ "$rc" -ne 0 ] && [ -z "$reason" ]; then
    reason="unexpected error (exit $rc)"
  fi
  for unit in "${stopped[@]}"; do
    if systemctl start "$unit" >/dev/null 2>&1; then
      restarted+=("$unit")
    else
      failed+=("$unit")
    fi
  done
  echo "unloaded=$(join "${unloaded[@]}")"
  echo "probed=$(join "${probed[@]}")"
  echo "restarted=$(join "${restarted[@]}")"
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "restart_failed=$(join "${failed[@]}")"
  fi
  echo "reloaded=$reloaded"
  echo "reason=$reason"
  echo "loaded=$(version)"
  exit 0
}
trap finish EXIT

before=$(version)
echo "before=$before"
if [ -n "$want" ] && [ "$before" = "$want" ]; then
  reason="driver $want is already loaded"
  exit 0
fi

# 1. The services that hold the GPU.
for unit in "${services[@]}"; do
  if systemctl is-active --quiet "$unit" 2>/dev/null; then
    if ! out=$(systemctl stop "$unit" 2>&1); then
      reason="could not stop $unit: $(first_line "$out")"
      break
    fi
    stopped+=("$unit")
  fi
done
echo "stopped=$(join "${stopped[@]}")"
[ -z "$reason" ] || exit 0

# 2. Anything still using the driver: processes with a device open, then module references.
holders=()
for fd in "$proc"/[0-9]*/fd/*; do
  target=$(readlink "$fd" 2>/dev/null) || continue
  case "$target" in
    /dev/nvidia*)
      pid=${fd#"$proc"/}
      pid=${pid%%/*}
      name=$(cat "$proc/$pid/comm" 2>/dev/null || echo '?')
      entry="$pid:$name"
      case " ${holders[*]} " in
        *" $entry "*) ;;
        *) holders+=("$entry") ;;
      esac
      ;;
  esac
done
if [ "${#holders[@]}" -gt 0 ]; then
  echo "holders=$(join "${holders[@]}")"
  reason="processes hold /dev/nvidia*: $(join "${holders[@]}"); not unloaded"
  exit 0
fi

present=()
for module in "${modules[@]}"; do
  if is_loaded "$module"; then
    present+=("$module")
  fi
done
for module in "${present[@]}"; do
  refs=$(cat "$modules_dir/$module/refcnt" 2>/dev/null || echo 0)
  [[ "$refs" =~ ^[0-9]+$ ]] || refs=0
  ours=0
  others=()
  for holder in "$modules_dir/$module/holders"/*; do
    holder=${holder##*/}
    case " ${present[*]} " in
      *" $holder "*) ours=$((ours + 1)) ;;
      *) others+=("$holder") ;;
    esac
  done
  if [ "${#others[@]}" -gt 0 ]; then
    reason="$module is used by module $(join "${others[@]}"); not unloaded"
  elif [ "$refs" -gt "$ours" ]; then
    reason="$module is in use (refcnt $refs, $ours from the NVIDIA modules unloaded with it)"
    if [ "$module" = nvidia_drm ] || [ "$module" = nvidia_modeset ]; then
      reason="$reason: a display or console may be attached"
    fi
    reason="$reason; not unloaded"
  fi
  [ -z "$reason" ] || exit 0
done

# 3. Unload in dependency order; a refusal stops here, and what was unloaded is loaded again
#    where it still can be (a newer module on disk may not match the loaded nvidia).
for module in "${present[@]}"; do
  if ! out=$(rmmod "$module" 2>&1); then
    reason="rmmod $module failed: $(first_line "$out")"
    if [ "$module" = nvidia_drm ]; then
      reason="$reason (a display or console may be attached to it)"
    fi
    restore=()
    for ((i = ${#unloaded[@]} - 1; i >= 0; i--)); do
      if modprobe "${unloaded[i]}" >/dev/null 2>&1; then
        probed+=("${unloaded[i]}")
      else
        restore+=("${unloaded[i]}")
      fi
    done
    if [ "${#restore[@]}" -gt 0 ]; then
      reason="$reason; could not load $(join "${restore[@]}") again"
    fi
    exit 0
  fi
  unloaded+=("$module")
done

# Load nvidia first, then the modules that were loaded, each after what it depends on.
load=(nvidia)
for ((i = ${#present[@]} - 1; i >= 0; i--)); do
  [ "${present[i]}" = nvidia ] || load+=("${present[i]}")
done
for module in "${load[@]}"; do
  if ! out=$(modprobe "$module" 2>&1); then
    reason="modprobe $module failed: $(first_line "$out")"
    exit 0
  fi
  probed+=("$module")
done

now=$(version)
if [ -z "$now" ]; then
  reason="nvidia loaded but reports no version"
elif [ -n "$want" ] && [ "$now" != "$want" ]; then
  reason="driver $now loaded after the reload, not $want (the module on disk is not the lock's)"
else
  reloaded=yes
fi
