"""The quick level's GPU checks: each reads a node's Facts, holds them to its Expect, and
returns one HealthCheck (node filled in by the caller). Thresholds and actions cite their
sources here and in docs/health.md."""

from __future__ import annotations

from gpuprov import catalog
from gpuprov.health import parse
from gpuprov.health.facts import Expect, Facts
from gpuprov.results.shapes import HealthCheck

# The alert rule the project started from: a GPU above 85 °C needs a person.
ALERT_C = 85

RESET = "drain the node and reset the GPU (nvidia-smi -r -i GPU, or reboot the node); RMA if it recurs"
RMA = "RMA: isolate the node (drain it, take it out of service, open a hardware case)"


def passed(check: str, found: str, expected: str) -> HealthCheck:
    return HealthCheck(node="", check=check, status="pass", found=found, expected=expected, action="")


def failed(check: str, found: str, expected: str, action: str) -> HealthCheck:
    return HealthCheck(node="", check=check, status="fail", found=found, expected=expected, action=action)


def skipped(check: str, reason: str, expected: str = "") -> HealthCheck:
    return HealthCheck(node="", check=check, status="skip", found="", expected=expected, action="",
                       reason=reason)


def no_gpu(facts: Facts, expect: Expect) -> str | None:
    """Why the node can have no GPU to check (a skip's reason), or None when it has or must
    have GPUs."""
    if facts.gpus_on_bus or expect.gpus:
        return None
    where = "container node: " if facts.container else ""
    if expect.gpus == 0:
        return f"{where}{expect.kind} has no GPU (catalog: 0 GPUs)"
    return f"{where}no NVIDIA GPU on the PCI bus"


def gpu_count(facts: Facts, expect: Expect) -> HealthCheck:
    found = facts.gpus_on_bus
    models = sorted({catalog.GPU_BY_PCI_DEVICE.get(d, d) for d in facts.bus["gpu_device_ids"]})
    seen = f"{found} NVIDIA GPU(s) on the PCI bus" + (f" ({', '.join(models)})" if models else "")
    if expect.gpus is None:
        return skipped("gpu_count", f"no GPU count expected of {expect.kind} (found {found}): give its "
                       "instance_type or gpus (--local: --type or --gpus)")
    want = f"{expect.gpus} x {expect.gpu_model or 'NVIDIA GPU'} ({expect.kind})"
    if found < expect.gpus:
        return failed("gpu_count", seen, want, "reboot the node (a GPU that fell off the bus can come back at "
                      f"boot); if it stays missing, {RMA}")
    if found > expect.gpus:
        return failed("gpu_count", seen, want, "check the node's declared type (hosts file, --type): the "
                      "catalog says fewer GPUs")
    odd = [m for m in models if expect.gpu_model and m != expect.gpu_model]
    if odd:
        return failed("gpu_count", seen, want, "check the node's declared type (hosts file, --type): its GPUs "
                      "are another model")
    return passed("gpu_count", seen, want)


def gpu_answers(facts: Facts, expect: Expect) -> HealthCheck:
    if reason := no_gpu(facts, expect):
        return skipped("gpu_answers", reason)
    want_n = max(facts.gpus_on_bus, expect.gpus or 0)
    want = f"nvidia-smi answers for each of {want_n} GPU(s)"
    rows, other = facts.smi
    errors = parse.smi_errors(other)
    if facts.rc("smi_ids") == 127 or "not found" in " ".join(other):
        return failed("gpu_answers", "no nvidia-smi (driver not installed)", want,
                      f"install the driver: `{expect.provision}`")
    if any("mismatch" in e for e in errors):
        return failed("gpu_answers", errors[0], want, "reboot the node: the loaded kernel module is not the "
                      "installed driver's (Driver/library version mismatch)")
    if len(rows) < want_n or errors or facts.rc("smi_ids") not in (0, None):
        found = f"nvidia-smi lists {len(rows)} of {want_n} GPU(s)" + (f": {errors[0]}" if errors else "")
        if facts.rc("smi_ids") == 124:
            found += " (nvidia-smi hung: killed after 20 s)"
        return failed("gpu_answers", found, want, "drain and reboot the node (a GPU that does not answer "
                      f"nvidia-smi needs at least a GPU reset); {RMA} if it recurs")
    names = sorted({r.get("name", "?") for r in rows})
    return passed("gpu_answers", f"{len(rows)} GPU(s) answer: {', '.join(names)}", want)


def driver(facts: Facts, expect: Expect) -> HealthCheck:
    if reason := no_gpu(facts, expect):
        return skipped("driver", reason)
    lock = (expect.lock or {}).get("driver")
    want = f"driver {lock} (the lock), loaded and answering" if lock else "the lock's driver"
    loaded = parse.driver_of_proc(facts.text("proc_version"))
    smi = sorted({r.get("driver_version", "") for r in facts.smi[0]} - {""})
    if loaded is None:
        return failed("driver", "no NVIDIA kernel module loaded (/proc/driver/nvidia/version)", want,
                      f"reboot the node; if the module still does not load, `{expect.provision}` rebuilds it")
    if not lock:
        return failed("driver", f"module {loaded} loaded", want, f"resolve the cluster's lock: `{expect.provision}`")
    if loaded != lock or (smi and smi != [lock]):
        return failed("driver", f"kernel module {loaded}, nvidia-smi {', '.join(smi) or 'none'}", want,
                      f"bring the driver to the lock (`{expect.provision}`, or `gpuprov patch` on a live fleet), then "
                      "reboot if the loaded module is still the old one")
    return passed("driver", f"kernel module {loaded}" + (", nvidia-smi agrees" if smi else ""), want)


def fabricmanager(facts: Facts, expect: Expect) -> HealthCheck:
    lock = expect.lock or {}
    if not facts.nvswitches and not expect.nvswitch:
        return skipped("fabricmanager", f"no NVSwitch on the PCI bus ({expect.kind}): no fabric manager")
    want = f"nvidia-fabricmanager {lock.get('fabricmanager') or lock.get('driver')} active (the driver's release)"
    state = (facts.text("fabricmanager").strip().splitlines() or ["unknown"])[0]
    packages = parse.fabricmanager_packages(facts.text("fabricmanager_pkg"))
    versions = sorted(packages.values())
    found = f"nvidia-fabricmanager {state}; installed: {', '.join(f'{p} {v}' for p, v in packages.items()) or 'none'}"
    fix = ("restart it (systemctl restart nvidia-fabricmanager; CUDA fails with error 802 without it); if it "
           f"will not start, its release must be the driver's: `{expect.provision}`")
    if not facts.nvswitches:
        return failed("fabricmanager", f"no NVSwitch on the PCI bus; {found}", want,
                      f"reboot the node (NVSwitches gone from the bus); {RMA} if they stay missing")
    driver_release = lock.get("driver")
    if state != "active" or not versions or (driver_release and not all(
            v.startswith(f"{driver_release}-") for v in versions)):
        return failed("fabricmanager", found, want, fix)
    return passed("fabricmanager", found, want)


def nvlink(facts: Facts, expect: Expect) -> HealthCheck:
    if reason := no_gpu(facts, expect):
        return skipped("nvlink", reason)
    per_gpu = expect.nvlink_per_gpu
    links = parse.nvlink_status(facts.text("nvlink"))
    gpus = max(facts.gpus_on_bus, expect.gpus or 0)
    if per_gpu is None and not links:
        why = ("one GPU: no NVLink peer" if gpus <= 1 else
               f"{expect.kind} has no NVLink count in the catalog and nvidia-smi reports no NVLink")
        return skipped("nvlink", why)
    want = (f"{per_gpu} NVLink links up on each of {gpus} GPU(s) (catalog, {expect.kind})" if per_gpu
            else "every NVLink link nvidia-smi reports up")
    down = [f"{g.gpu}: {g.active} up" + (f", links {','.join(map(str, g.inactive))} inactive" if g.inactive else "")
            for g in links if g.inactive or (per_gpu and g.active < per_gpu)]
    found = f"{sum(g.active for g in links)} links up on {len(links)} GPU(s)"
    action = ("drain the node and reset the GPUs (with fabric manager running, links train at reset); "
              f"if a link stays down, {RMA}")
    if per_gpu and len(links) < gpus:
        return failed("nvlink", f"{found}; nvidia-smi reports NVLink for {len(links)} of {gpus} GPU(s)", want, action)
    if down:
        return failed("nvlink", f"{found}; {'; '.join(down)}", want, action)
    return passed("nvlink", found, want)
