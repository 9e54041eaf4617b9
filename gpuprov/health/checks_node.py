"""The quick level's node checks: Xid errors in the kernel log since boot, EFA devices,
memlock and nvidia-peermem as the rdma role sets them (roles/rdma/tasks/memlock.yml,
gpudirect.yml)."""

from __future__ import annotations

from gpuprov.health import parse, xid
from gpuprov.health.checks_gpu import failed, no_gpu, passed, skipped
from gpuprov.health.facts import Expect, Facts
from gpuprov.node_text import memlock_text
from gpuprov.results.shapes import HealthCheck


def xids(facts: Facts, expect: Expect) -> HealthCheck:
    if facts.container:
        return skipped("xid", f"container node ({facts.container}): the kernel log is the host's, not the node's")
    want = "no Xid that needs a reset, a reboot or an RMA since boot (NVIDIA's Xid catalog)"
    log, source = facts.text("kernel_log"), facts.text("kernel_log_source").strip()
    if source not in ("journalctl", "dmesg"):
        return failed("xid", f"the kernel log cannot be read ({source or 'no answer'})", want,
                      "run the health check as root (or give the login passwordless sudo): the kernel log is root's")
    found = xid.events(log)
    worst = xid.worst(found)
    if worst is None:
        return passed("xid", f"no Xid in the kernel log since boot ({source})", want)
    line = xid.summary(found)
    if worst == "watch":
        return passed("xid", line, want)
    return failed("xid", line, want, xid.ACTION_TEXT[worst])


def efa(facts: Facts, expect: Expect) -> HealthCheck:
    want_n = expect.efa_interfaces
    if not want_n:
        return skipped("efa", f"{expect.kind} has no EFA (catalog)")
    if facts.container:
        return skipped("efa", f"container node ({facts.container}): no EFA devices of its own")
    devices = sorted(d for d, drv in parse.infiniband(facts.text("infiniband")).items() if drv == "efa")
    want = f"{want_n} EFA device(s) (catalog, {expect.kind})"
    found = f"{len(devices)} EFA device(s) in /sys/class/infiniband" + (f": {', '.join(devices)}" if devices else "")
    if len(devices) != want_n:
        return failed("efa", found, want, "check the instance's network interfaces (every EFA interface attached "
                      "at launch) and the efa kernel module (modprobe efa); reboot if devices are missing")
    return passed("efa", found, want)


def memlock(facts: Facts, expect: Expect) -> HealthCheck:
    want = "memlock unlimited (soft and hard) for users" + (", DefaultLimitMEMLOCK=infinity for services"
                                                           if facts.text("systemd").strip() == "yes" else "")
    pid1 = facts.text("memlock_pid1").split()
    ceiling = pid1[-1] if pid1 else "unknown"
    if facts.container and ceiling != "unlimited":
        return skipped("memlock", f"container node ({facts.container}): its engine caps memlock at "
                       f"{memlock_text(ceiling, 1)} and the node cannot raise it (run the node with "
                       "--ulimit memlock=-1)", want)
    user = facts.text("memlock_user").split()  # `ulimit -l`: KiB
    problems = [] if user == ["unlimited", "unlimited"] else [
        "user session: " + (" / ".join(memlock_text(v, 1024) for v in user) or "no answer")]
    if facts.text("systemd").strip() == "yes":
        service = facts.text("memlock_systemd").strip()
        if service != "DefaultLimitMEMLOCK=infinity":
            key, _, value = service.partition("=")
            problems.append(f"services: {key}={memlock_text(value, 1)}" if value
                            else f"services: {service or 'no answer'}")
    fix = f"re-apply the rdma role (`{expect.provision} --tags rdma`): it sets memlock unlimited"
    if problems:
        return failed("memlock", "; ".join(problems), want, fix)
    return passed("memlock", "memlock unlimited for users" + (" and services" if len(want.split(",")) > 1 else ""),
                  want)


def peermem(facts: Facts, expect: Expect) -> HealthCheck:
    if expect.efa_interfaces:
        return skipped("peermem", f"{expect.kind} uses EFA, whose GPUDirect path needs no nvidia-peermem")
    if reason := no_gpu(facts, expect):
        return skipped("peermem", reason)
    if not [d for d, driver in parse.infiniband(facts.text("infiniband")).items() if driver != "efa"]:
        # nvidia-peermem serves an InfiniBand/RoCE adapter; with none (a one-GPU VM, say: the
        # real H200 of tests/fixtures/recordings/h200-580) it has nothing to do.
        return skipped("peermem", "no InfiniBand/RoCE device in /sys/class/infiniband: GPUDirect RDMA "
                       "has no adapter here")
    want = "nvidia-peermem loaded at boot (/etc/modules-load.d)" + ("" if facts.container else " and loaded")
    configured = "nvidia-peermem" in facts.text("modules_load").split()
    loaded = "nvidia_peermem" in facts.text("lsmod").split()
    found = f"modules-load.d: {'yes' if configured else 'no'}; loaded: {'yes' if loaded else 'no'}"
    if not configured or not (loaded or facts.container):
        return failed("peermem", found, want, f"re-apply the rdma role (`{expect.provision} --tags rdma`), or "
                      "modprobe nvidia-peermem (GPUDirect RDMA over InfiniBand needs it)")
    return passed("peermem", found, want)
