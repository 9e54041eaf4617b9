"""Probes for CPU microcode (role microcode): the vendor's package at the lock's pin,
early loading, and the running revision against the packaged one."""

from __future__ import annotations

import json

import pytest

from gpuprov.probes.nodefacts import installed_version

PACKAGES = {"GenuineIntel": ("intel", "intel-microcode"), "AuthenticAMD": ("amd", "amd64-microcode")}
FACT = "/etc/ansible/facts.d/gpuprov_microcode.fact"


def _vendor(host) -> tuple[str, str]:
    vendor_id = host.run("awk -F': ' '/^vendor_id/ { print $2; exit }' /proc/cpuinfo").stdout.strip()
    if vendor_id not in PACKAGES:
        pytest.skip(f"CPU vendor {vendor_id or '?'} has no microcode package (Intel and AMD only)")
    return PACKAGES[vendor_id]


@pytest.mark.microcode
def test_microcode_package_matches_the_pin(host, expect, report):
    vendor, package = _vendor(host)
    # The lock pins Debian's packages (12's, or 13's); other distributions get their newest.
    debian = host.system_info.distribution == "debian"
    pin = ((expect.stack or {}).get("microcode") or {}).get(vendor) if debian else None
    found = installed_version(host, package)
    assert found is not None, f"expected {package} installed ({vendor} CPU), found it not installed"
    assert pin is None or found == pin, f"expected {package} {pin} (the lock's pin), found {found}"
    report(f"{package} {found}" + (" (the lock's pin)" if pin else " (no pin in this lock)"))


@pytest.mark.microcode
def test_microcode_loaded_early(host, report):
    vendor, _package = _vendor(host)
    path, key = {"intel": ("/etc/default/intel-microcode", "IUCODE_TOOL_INITRAMFS"),
                 "amd": ("/etc/default/amd64-microcode", "AMD64UCODE_INITRAMFS")}[vendor]
    setting = host.run(f"grep -E '^{key}=' {path}").stdout.strip()
    assert setting == f"{key}=early", f"expected {key}=early in {path}, found {setting or 'nothing'}"
    report(f"{path}: {setting}")


@pytest.mark.microcode
def test_microcode_running_revision_or_reboot_flagged(host, report):
    _vendor(host)
    out = host.run(FACT)
    assert out.rc == 0, f"expected the revision fact {FACT} to run, it failed: {out.stderr.strip()[:200]}"
    state = json.loads(out.stdout)
    if not state["loadable"]:
        pytest.skip(f"this node cannot load microcode: {state['not_loadable_reason']} "
                    f"(running {state['running']}, packaged {state['packaged']})")
    running, packaged = state["running"], state["packaged"]
    if packaged is None or int(running, 16) >= int(packaged, 16):
        report(f"running {running}, packaged {packaged or 'none for this CPU'}: up to date")
        return
    flagged = host.file("/run/reboot-required").exists
    assert flagged, (f"expected running revision {packaged} (packaged) or a reboot flagged, found "
                     f"{running} running and no /run/reboot-required")
    report(f"running {running}, packaged {packaged}: reboot flagged (/run/reboot-required)")
