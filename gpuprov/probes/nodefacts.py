"""Readings probes take on the node itself (never from expectations).

Every attribute testinfra reads is one command on the node (over SSH and sudo: about half a
second on a busy 2-core controller), so a reading here asks once for all it needs: one ``stat``
for a file's mode and owners, one ``cat`` for a file that may be missing, one command for a
unit's active and enabled states, one ``dpkg-query`` for a package. Facts that no probe changes
(PID 1, the container, the PCI bus) are read once per node and probe session (``once``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def once(host: Any, key: str, read: Callable[[], T]) -> T:
    """``read()`` the first time a probe session asks ``host`` for ``key``, the same answer after:
    testinfra keeps one host object per node and session, and probes only read."""
    memo = vars(host).setdefault("_gpuprov_facts", {})
    if key not in memo:
        memo[key] = read()
    return memo[key]


@dataclass(frozen=True)
class Stat:
    mode: int
    user: str
    group: str
    size: int
    kind: str  # stat's %F: "regular file", "directory", "symbolic link", ...


def file_stat(host: Any, path: str) -> Stat | None:
    """A file's mode, owner, group, size and kind in one command (not following a link, as
    testinfra's); None when there is nothing at ``path``."""
    out = host.run("stat -c '%%a %%U %%G %%s %%F' -- %s", path)
    if out.rc != 0:
        if "No such file" in out.stderr:
            return None
        raise AssertionError(f"could not stat {path}: {out.stderr.strip()[:200]}")
    mode, user, group, size, kind = out.stdout.strip().split(" ", 4)
    return Stat(int(mode, 8), user, group, int(size), kind)


def read_text(host: Any, path: str) -> str | None:
    """A file's text in one command; None when there is nothing at ``path``."""
    out = host.run("test -e %s || exit 3; exec cat -- %s", path, path)
    if out.rc == 3:
        return None
    if out.rc != 0:
        raise AssertionError(f"could not read {path}: {out.stderr.strip()[:200]}")
    return out.stdout


def exists(host: Any, path: str) -> bool:
    return host.run("test -e %s", path).rc == 0


@dataclass(frozen=True)
class Unit:
    name: str
    active: str  # systemctl is-active's word: active, inactive, failed, ...
    enabled: str  # systemctl is-enabled's word: enabled, disabled, static, masked, ...
    is_running: bool
    is_enabled: bool

    def __str__(self) -> str:
        return f"{self.name} {self.active or 'unknown'}, {self.enabled or 'not found'}"


def parse_unit(name: str, stdout: str) -> Unit:
    """``unit_state``'s output: is-active's word, is-enabled's word (none for a unit systemd
    does not know), then both exit codes; running and enabled by the codes, as testinfra reads
    them (is-enabled exits 0 for enabled, static, alias, indirect, generated, ...)."""
    lines = stdout.splitlines()
    codes = lines[-1].split() if lines else []
    if len(codes) != 2 or not all(c.isdigit() for c in codes):
        raise AssertionError(f"unreadable state of unit {name}: {stdout.strip()[:200]!r}")
    words = [w.strip() for w in lines[:-1]]
    active = words[0] if words else ""
    enabled = words[1] if len(words) > 1 else ""
    return Unit(name, active, enabled, is_running=codes[0] == "0", is_enabled=codes[1] == "0")


def unit_state(host: Any, name: str) -> Unit:
    """A systemd unit's active and enabled states in one command (``require_systemd`` first)."""
    out = host.run("systemctl is-active -- %s; a=$?; systemctl is-enabled -- %s 2>/dev/null; e=$?; "
                   'echo "$a $e"', name, name)
    return parse_unit(name, out.stdout)


def in_container(host: Any) -> str | None:
    """The container technology the node runs in, as the node itself says; None on a VM/metal."""
    return once(host, "container", lambda: _container(host))


def _container(host: Any) -> str | None:
    cmd = host.run("systemd-detect-virt --container")
    kind = cmd.stdout.strip()
    return kind if cmd.rc == 0 and kind and kind != "none" else None


def nvidia_pci(host: Any) -> dict[str, int]:
    """NVIDIA GPUs and NVSwitches on the node's PCI bus, read from sysfs by the probe itself."""
    return dict(once(host, "nvidia_pci", lambda: _nvidia_pci(host)))


def _nvidia_pci(host: Any) -> dict[str, int]:
    out = host.run(
        "for d in /sys/bus/pci/devices/*; do "
        '[ "$(cat $d/vendor 2>/dev/null)" = 0x10de ] && cat $d/class; done; true'
    ).stdout.split()
    return {
        "gpus": sum(1 for c in out if c.startswith(("0x0300", "0x0302"))),
        "nvswitches": sum(1 for c in out if c.startswith("0x0680")),
    }


def installed_kernels(host: Any) -> list[str]:
    """Kernels the node has an image or headers for, plus the one it runs (unless a container)
    and the one its next boot loads (/boot/vmlinuz)."""
    out = host.run(
        "dpkg-query -W -f='${Status}\\t${Package}\\n' 'linux-image-[0-9]*' 'linux-headers-[0-9]*' "
        "2>/dev/null | awk -F'\\t' '$1 ~ / installed$/ && $2 !~ /-common$/ "
        '{ sub(/^linux-(image|headers)-/, "", $2); print $2 }\''
    ).stdout.split()
    kernels = set(out)
    if not in_container(host):
        kernels.add(host.run("uname -r").stdout.strip())
        nxt = host.run("readlink -f /boot/vmlinuz").stdout.strip()
        if nxt.startswith("/boot/vmlinuz-"):
            kernels.add(nxt.removeprefix("/boot/vmlinuz-"))
    return sorted(kernels)


def installed_version(host: Any, package: str) -> str | None:
    """A Debian package's version when it is installed (dpkg's "installed" state), in one
    command; None otherwise."""
    out = host.run("dpkg-query -W -f '${db:Status-Status} ${Version}' %s", package)
    state, _, version = out.stdout.strip().partition(" ")
    return version if out.rc == 0 and state == "installed" and version else None


def held_packages(host: Any) -> frozenset[str]:
    """The packages held on the node: dpkg's selection ``hold``, what ``apt-mark hold`` sets and
    ``apt-mark showhold`` lists (without loading apt's cache), read once per node and session."""
    return once(host, "held", lambda: _held_packages(host))


def _held_packages(host: Any) -> frozenset[str]:
    out = host.run("dpkg-query -W -f '${db:Status-Want} ${Package}\\n'")
    if out.rc != 0:
        raise AssertionError(f"expected dpkg-query to list the node's packages, it said: {out.stderr.strip()}")
    rows = (line.split(" ", 1) for line in out.stdout.splitlines())
    return frozenset(row[1] for row in rows if len(row) == 2 and row[0] == "hold")


def require_systemd(host: Any) -> None:
    """Fail with the reason, not a shell error, on a node whose PID 1 is not systemd: gpuprov's
    roles run services and units (sd_booted(3): systemd booted the node when
    /run/systemd/system is a directory)."""
    init = once(host, "init", lambda: _init(host))
    if init is not None:
        raise AssertionError(f"expected a node run by systemd, found PID 1 '{init}' (no /run/systemd/system): "
                             "gpuprov's roles need systemd for their services")


def _init(host: Any) -> str | None:
    """None on a node systemd booted; else the name of its PID 1."""
    out = host.run("test -d /run/systemd/system && exit 0; cat /proc/1/comm; exit 1")
    return None if out.rc == 0 else (out.stdout.strip() or "unknown")


def rdma_adapters(host: Any) -> dict[str, str]:
    """The InfiniBand/RoCE adapters in /sys/class/infiniband: {device: its kernel driver}, EFA's
    left out (what gpuprov health's peermem check reads: gpuprov/health/gather.py "infiniband")."""
    out = host.run('for d in /sys/class/infiniband/*; do [ -e "$d" ] && '
                   'echo "$(basename "$d") $(basename "$(readlink -f "$d/device/driver")")"; done; true').stdout
    found = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return {device: driver for device, driver in found.items() if driver != "efa"}
