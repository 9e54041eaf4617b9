"""What `gpuprov health` reads on a node: one fixed shell script, run once per node (over the
cluster's pinned-host-key SSH, or here with --local), that prints the raw output of each tool
in a named section. Nothing is decided on the node: every parser and verdict is Python
(gpuprov.health.parse, gpuprov.health.checks_gpu and the other checks_ modules), tested on
recordings of real machines.

The script is a constant: nothing of the inventory or the user's input reaches it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprov.node_text import printable

# Each section starts with this marker line: "@@gpuprov-health NAME" and ends with
# "@@gpuprov-health-rc NAME N" (the exit status of its command).
MARK = "@@gpuprov-health"

# NAME -> the shell command whose output the section holds. Each is bounded by `timeout` so
# that a hung nvidia-smi (a GPU that fell off the bus can hang it) costs seconds, not the run.
COMMANDS: dict[str, str] = {
    "uid": "id -u",
    "container": "systemd-detect-virt --container 2>/dev/null || { [ -f /.dockerenv ] && echo docker; }",
    "pci": ('for d in /sys/bus/pci/devices/*; do v=$(cat "$d/vendor" 2>/dev/null); '
            '[ "$v" = 0x10de ] && echo "$d vendor=$v device=$(cat "$d/device") class=$(cat "$d/class")"; '
            "done; true"),
    "smi_ids": ("timeout 20 nvidia-smi --format=csv "
                "--query-gpu=index,pci.bus_id,name,uuid,driver_version 2>&1"),
    "smi_q": "timeout 30 nvidia-smi -q -d ECC,ROW_REMAPPER,TEMPERATURE,PERFORMANCE 2>&1",
    "nvlink": "timeout 20 nvidia-smi nvlink -s 2>&1",
    "proc_version": "cat /proc/driver/nvidia/version 2>&1",
    # The kernel log since boot, NVRM lines only (Xid and "fallen off the bus").
    "kernel_log": ("{ journalctl -k -b --no-pager -q -o short-monotonic 2>/dev/null || dmesg 2>&1; } "
                   "| grep -E 'NVRM|Xid|fallen off the bus' | tail -n 2000"),
    "kernel_log_source": ("if journalctl -k -b -q -n 1 --no-pager >/dev/null 2>&1; then echo journalctl; "
                          "elif dmesg >/dev/null 2>&1; then echo dmesg; else dmesg 2>&1 | head -1; fi"),
    "fabricmanager": "systemctl is-active nvidia-fabricmanager 2>&1",
    "fabricmanager_pkg": ("dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n' "
                          "'*fabricmanager*' 2>/dev/null"),
    "infiniband": ('for d in /sys/class/infiniband/*; do [ -e "$d" ] && '
                   'echo "$(basename "$d") $(basename "$(readlink -f "$d/device/driver")")"; done; true'),
    "memlock_user": "runuser -u nobody -- sh -c 'ulimit -l; ulimit -Hl' 2>&1",
    "memlock_pid1": "awk '/^Max locked memory/ { print $4, $5 }' /proc/1/limits",
    "memlock_systemd": "systemctl show --property DefaultLimitMEMLOCK 2>&1",
    "systemd": "[ -d /run/systemd/system ] && echo yes || echo no",
    "lsmod": "cat /proc/modules 2>&1 | awk '{ print $1 }'",
    "modules_load": "cat /etc/modules-load.d/*.conf 2>/dev/null",
}

# The standard level's sections, after the quick level's: DCGM's diagnostic level 2 and NCCL's
# all_reduce_perf inside the node. Each runs only where an NVIDIA GPU is on the PCI bus, and
# says "not installed" with exit 127 where its tool is missing. Time budgets: DCGM level 2 runs
# minutes on 8 GPUs (longer than Slurm's 180 s prolog timeout on p4d and p5: aws-parallelcluster
# issue 6777), so it gets 600 s; all_reduce_perf up to 2 GiB on one node, 300 s.
# The full level runs DCGM's level 3 instead (NVIDIA's DCGM user guide: level 3 "Long", about
# 15 minutes on a full node; given twice that), and adds what the run across nodes needs: the
# node's own address on its default route (where the other nodes reach it) and mpirun.
DCGM_BUDGET_S = {2: 600, 3: 1800}
NCCL_BUDGET_S = 300
_GPU_GUARD = ("grep -qs 0x10de /sys/bus/pci/devices/*/vendor || { echo 'no NVIDIA device on the PCI bus'; "
              "exit 0; }; ")
STANDARD: dict[str, str] = {
    "dcgm_diag": (_GPU_GUARD + "command -v dcgmi >/dev/null || { echo 'dcgmi: not found'; exit 127; }; "
                  "timeout @DCGM_BUDGET@ dcgmi diag -r @DCGM_LEVEL@ @NVLINKS@ 2>&1"),
    "nccl_tests": (_GPU_GUARD + "b=$(command -v all_reduce_perf || ls /opt/nccl-tests/build/all_reduce_perf "
                   "2>/dev/null) || { echo 'all_reduce_perf: not found'; exit 127; }; "
                   "n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); "
                   f'timeout {NCCL_BUDGET_S} "$b" -b 8 -e 2G -f 2 -g "$n" 2>&1'),
}
FULL: dict[str, str] = {
    "cluster_address": ("i=$(ip -4 route show default 2>/dev/null | awk '{ print $5; exit }'); "
                        '[ -n "$i" ] && ip -4 -o addr show dev "$i" | awk \'{ split($4, a, "/"); print a[1]; exit }\''),
    "mpirun": "command -v mpirun || { echo 'mpirun: not found'; exit 127; }",
    # A Slurm cluster's run goes through srun (the node's Slurm name: its short hostname).
    "slurm_name": "uname -n | cut -d. -f1",
}
# How long one node's script may run, by level.
BUDGET_S = {"quick": 90, "standard": 90 + DCGM_BUDGET_S[2] + NCCL_BUDGET_S + 30,
            "full": 90 + DCGM_BUDGET_S[3] + NCCL_BUDGET_S + 30}

# Run as root where the login may become root without a password (the kernel log and
# /proc/1/limits need it); otherwise as the login, and the uid section says so.
REMOTE_COMMAND = ('if [ "$(id -u)" = 0 ] || ! sudo -n true 2>/dev/null; then exec sh -s; '
                  "else exec sudo -n sh -s; fi")


def dcgm_level(level: str) -> int:
    """DCGM's diagnostic level a health level runs (0: none)."""
    return {"standard": 2, "full": 3}.get(level, 0)


def script(level: str = "quick", nvlinks: int | None = None) -> str:
    """The whole script: each command of the level in its section (COMMANDS, then STANDARD's
    for the standard and full levels, DCGM at the level's depth, then FULL's). ``nvlinks``, the
    NVLink links each GPU must have up (an int from the catalog, nothing a user typed), is given
    to DCGM's PCIe test."""
    commands = dict(COMMANDS)
    if dcgm := dcgm_level(level):
        flag = f"-p pcie.gpu_nvlinks_expected_up={int(nvlinks)}" if nvlinks else ""
        commands.update({k: v.replace("@NVLINKS@", flag).replace("@DCGM_LEVEL@", str(dcgm))
                         .replace("@DCGM_BUDGET@", str(DCGM_BUDGET_S[dcgm])) for k, v in STANDARD.items()})
    if level == "full":
        commands.update(FULL)
    parts = ["export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH"]
    for name, command in commands.items():
        parts.append(f"echo '{MARK} {name}'; ( {command} ); echo \"{MARK}-rc {name} $?\"")
    return "\n".join(parts) + "\n"


@dataclass(frozen=True)
class Section:
    """One command's output on a node, and its exit status (None: the section never ended,
    the script was cut off there)."""

    text: str
    rc: int | None


_START = re.compile(rf"^{re.escape(MARK)} (\w+)$")
_END = re.compile(rf"^{re.escape(MARK)}-rc (\w+) (\d+)$")


def split(output: str) -> dict[str, Section]:
    """The sections of the script's output, by name."""
    sections: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []
    for line in printable(output, lines=True).splitlines():  # the node's words: no escape reaches a terminal
        start, end = _START.match(line), _END.match(line)
        if start:
            if name is not None:
                sections[name] = Section("\n".join(lines), None)
            name, lines = start.group(1), []
        elif end and name is not None and end.group(1) == name:
            sections[name] = Section("\n".join(lines), int(end.group(2)))
            name, lines = None, []
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = Section("\n".join(lines), None)
    return sections


def recorded(text: str) -> str:
    """A recording's body: the capture scripts' first line (`$ command`) and last line
    (`[exit N]`) left out (tests/fixtures/recordings/README.md)."""
    lines = text.splitlines()
    if lines and lines[0].startswith("$ "):
        lines = lines[1:]
    if lines and re.fullmatch(r"\[exit \d+\]", lines[-1].strip()):
        lines = lines[:-1]
    return "\n".join(lines)
