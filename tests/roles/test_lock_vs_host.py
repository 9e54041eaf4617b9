"""A version lock that contradicts the host, on a real node container.

- gpu_preflight: NVSwitch functions on the PCI bus and no fabric manager in the lock stop the
  host with the reason; the same bus with a fabric-manager lock, and the node's real bus (no
  NVSwitch) with a lock without one, pass (idempotent, --check clean).
- gpuprov_base: a lock of another OS (Debian 13's, on this Debian 12 node) stops the node in the
  run's first play, before anything is written; its own OS's lock passes.
- nvidia_fabricmanager: a lock that wants fabric manager on a host without NVSwitch stops at
  the start of the role, before anything is installed; with NVSwitches it installs.
- nvidia_driver: a driver this role did not install (a package installed by hand from the
  fixture repository, as DGX OS or a vendor image leaves one) is refused at another release,
  adopted at the lock's, replaced with nvidia_driver_replace_installed; its own driver moves
  with the lock without the flag (what `gpuprov patch` does); Secure Boot on (a fixture
  mokutil) stops a DKMS build with the enrolment steps, and without mokutil the role goes on.

The NVSwitch bus is a recorded one (tests/roles/fixtures/pci/README.md), copied into the node
and given to the roles through their internal PCI-tree knob: these containers see the test
machine's PCI bus, which has no NVIDIA device.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from gpuprov.lock import stack
from tests.conftest import run_cli
from tests.fixtures import aptrepo
from tests.roles.nodeplay import copy_in, play, sh

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "locks that contradict the host on a real node (about 7.5 minutes of two cores on a slower AMD EPYC); in `make "
    "test` the same checks of the lock against the host are the unit tests' (tests/unit/test_stack_os.py, "
    "test_kernel_compiler.py, test_driver_lifecycle.py, test_platforms.py) and the roles' own asserts run on every "
    "node of the e2e fleets; left out on 2026-12-02 (CI's time)"))]

FIXTURES = Path(__file__).parent / "fixtures"
NVSWITCH_BUS = FIXTURES / "pci" / "hgx-h100-nvswitch"
PCI_IN_NODE = "/opt/gpuprov-fixture-pci"
NVSWITCH_LOCK = stack.resolve("p4d.24xlarge", source="mirror", driver="535", kernel_module="proprietary").as_dict()
PLAIN_LOCK = stack.resolve(None).as_dict()


@pytest.fixture(scope="module")
def repos():
    from gpuprov.providers.docker import bridge_gateway

    r = aptrepo.start(bridge_gateway(), ["535.261.03", "535.288.01", "535.309.01"])
    yield r
    r.close()


@pytest.fixture(scope="module")
def node(env):
    name = f"lock-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap", "--no-baked",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    sh(cdir, name, "mkdir -p /opt")
    copy_in(name, NVSWITCH_BUS, PCI_IN_NODE)
    assert sh(cdir, name, f"cat {PCI_IN_NODE}/*/class | grep -c '^0x0680'").strip() == "4"
    yield name, cdir
    run_cli("down", name, "--yes", env=env)


def preflight(lock: dict) -> list[dict]:
    return [{"role": "gpu_preflight", "vars": {"gpu_preflight_lock": lock}}]


def test_preflight_stops_an_nvswitch_host_whose_lock_has_no_fabric_manager(env, node, tmp_path) -> None:
    _name, cdir = node
    rc, stats, msgs = play(env, cdir, tmp_path, preflight(PLAIN_LOCK), pci=PCI_IN_NODE)
    assert rc != 0 and stats["failures"] == 1, (stats, msgs)
    assert ("has 4 NVSwitch(es) on its PCI bus but the cluster's lock (resolved for unknown) has no "
            "fabric manager: CUDA would fail with error 802; declare the host's instance_type "
            "(e.g. dgx-a100) or gpus in the hosts file") in " ".join(msgs.split()), msgs


def test_preflight_passes_a_lock_that_fits_the_bus(env, node, tmp_path) -> None:
    _name, cdir = node
    # NVSwitches and a lock with fabric manager.
    rc, stats, msgs = play(env, cdir, tmp_path, preflight(NVSWITCH_LOCK), pci=PCI_IN_NODE)
    assert rc == 0 and stats["failures"] == 0, msgs
    # The node's real bus (no NVIDIA device) and a lock without fabric manager: converged,
    # a second run and --check change nothing.
    for check in (False, False, True):
        rc, stats, msgs = play(env, cdir, tmp_path, preflight(PLAIN_LOCK), check=check)
        assert rc == 0 and stats["failures"] == 0, msgs
    assert stats["changed"] == 0, stats


def test_a_lock_of_another_os_stops_the_node_before_anything_is_written(env, node, tmp_path) -> None:
    """One cluster, one OS: a Debian 12 node under a Debian 13 lock (a static host of another OS,
    or an --image of another OS than the cluster's --os) stops in gpuprov_base, named, with nothing
    changed; under its own OS's lock it goes on."""
    _name, cdir = node
    trixie = stack.resolve(None, source="distro", os="debian13").as_dict()
    roles = [{"role": "gpuprov_base", "vars": {"gpuprov_stack": trixie}}, *preflight(trixie)]
    rc, stats, msgs = play(env, cdir, tmp_path, roles)
    assert rc != 0 and stats["failures"] == 1 and stats["changed"] == 0, (stats, msgs)
    assert ("runs Debian 12 but the cluster's lock names Debian 13's packages (lock os debian13): a cluster "
            "runs one OS; boot this node from a Debian 13 image, or give its OS a cluster of its own (up --os)"
            ) in " ".join(msgs.split()), msgs
    rc, stats, msgs = play(env, cdir, tmp_path, [{"role": "gpuprov_base", "vars": {"gpuprov_stack": PLAIN_LOCK}},
                                                 *preflight(PLAIN_LOCK)])
    assert rc == 0 and stats["failures"] == 0, msgs


def fabricmanager(lock: dict, declared_nvswitch: bool = True) -> list[dict]:
    """The role as driver.yml runs it on a host the hosts file declares with (or without) NVSwitch
    (gpuprov's inventory says it per host: gpuprov_expected_nvswitch)."""
    params = {"nvidia_fabricmanager_package": lock["packages"]["fabricmanager"],
              "nvidia_fabricmanager_nvswitch_expected": declared_nvswitch,
              "nvidia_fabricmanager_version": lock["fabricmanager"],
              "nvidia_fabricmanager_package_version": lock["packages"]["fabricmanager_version"],
              "nvidia_fabricmanager_instance_type": lock["instance_type"]}
    return [{"role": "nvidia_fabricmanager", "vars": params}]


def test_fabric_manager_lock_on_a_host_without_nvswitch_stops_before_installing(env, node, tmp_path) -> None:
    name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, fabricmanager(NVSWITCH_LOCK))
    assert rc != 0
    flat = " ".join(msgs.split())
    assert ("lock for p4d.24xlarge expects NVSwitch, none on this host's PCI bus: fabric manager "
            "cannot start; check the host's declared instance_type") in flat, msgs
    assert "has no NVSwitch" not in flat
    assert not sh(cdir, name, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-535 2>/dev/null"
                              " | grep ' installed$'")
    # A mixed cluster's host declared without NVSwitch, none on its bus: no fabric manager, no failure.
    rc, stats, msgs = play(env, cdir, tmp_path, fabricmanager(NVSWITCH_LOCK, declared_nvswitch=False))
    assert rc == 0 and stats["failures"] == 0 and stats["changed"] == 0, (stats, msgs)
    assert not sh(cdir, name, "dpkg-query -W -f='${Status}' nvidia-fabricmanager-535 2>/dev/null"
                              " | grep ' installed$'")


def driver(repos, version: str, **extra) -> list[dict]:
    return [{"role": "nvidia_driver", "vars": {
        "nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": repos.good_url,
        "nvidia_driver_mirror_key_fingerprint": repos.fingerprint,
        "nvidia_driver_version": version,
        "nvidia_driver_packages": ["nvidia-driver-535", "nvidia-dkms-535"],
        "nvidia_driver_package_version": f"{version}-*", **extra}}]


def versions(cdir, name) -> dict[str, str]:
    out = sh(cdir, name, "dpkg-query -W -f='${Status}\\t${Package}\\t${Version}\\n' 'nvidia-*' 2>/dev/null"
                         " | awk -F'\\t' '$1 ~ / installed$/ { print $2 \"\\t\" $3 }'")
    return dict(line.split("\t") for line in out.splitlines() if line)


def test_driver_installed_by_another_is_refused_adopted_or_replaced(env, repos, node, tmp_path) -> None:
    name, cdir = node
    # The repository only (no driver from the role), then a driver installed by hand, as a
    # vendor image ships one.
    tasks = [{"name": "the fixture repository", "ansible.builtin.include_role": {
        "name": "gpuprov_base", "tasks_from": "apt_repository"},
        "vars": {"gpuprov_base_repo": {"name": "nvidia-mirror", "url": repos.good_url, "suites": "/",
                                       "key_url": f"{repos.good_url}repo.key",
                                       "fingerprint": repos.fingerprint}}}]
    rc, _, msgs = play(env, cdir, tmp_path, [], tasks)
    assert rc == 0, msgs
    sh(cdir, name, "apt-get install -y -q nvidia-driver-535=535.261.03-1 >/dev/null 2>&1")
    assert versions(cdir, name) == {"nvidia-driver-535": "535.261.03-1"}

    # Another release than the lock's: refused, nothing moved.
    rc, stats, msgs = play(env, cdir, tmp_path, driver(repos, "535.288.01"))
    assert rc != 0 and stats["failures"] == 1, (stats, msgs)
    assert ("has driver 535.261.03 installed (packages nvidia-driver-535 535.261.03-1); the lock says "
            "535.288.01: set nvidia_driver_replace_installed: true to replace it") in " ".join(msgs.split()), msgs
    assert versions(cdir, name) == {"nvidia-driver-535": "535.261.03-1"}

    # The lock's release: adopted, held, nothing installed from another package name; converged.
    for _ in range(2):
        seen: list[str] = []
        rc, stats, msgs = play(env, cdir, tmp_path, driver(repos, "535.261.03"), messages=seen)
        assert rc == 0 and stats["failures"] == 0, msgs
        assert any("adopted installed driver 535.261.03" in m for m in seen), "\n".join(seen)
        assert versions(cdir, name) == {"nvidia-driver-535": "535.261.03-1"}
        assert "nvidia-driver-535" in sh(cdir, name, "apt-mark showhold").split()
        record = json.loads(sh(cdir, name, "cat /var/lib/gpuprov/nvidia_driver.json"))
        assert record == {"driver": "535.261.03", "packages": [], "adopted": ["nvidia-driver-535"]}, record
    assert stats["changed"] == 0, stats

    # With the flag: replaced by the lock's packages, and recorded as this role's.
    rc, stats, msgs = play(env, cdir, tmp_path,
                           driver(repos, "535.288.01", nvidia_driver_replace_installed=True))
    assert rc == 0 and stats["failures"] == 0, msgs
    assert versions(cdir, name) == {"nvidia-driver-535": "535.288.01-1", "nvidia-dkms-535": "535.288.01-1"}
    record = json.loads(sh(cdir, name, "cat /var/lib/gpuprov/nvidia_driver.json"))
    assert record == {"driver": "535.288.01", "packages": ["nvidia-dkms-535", "nvidia-driver-535"],
                      "lock_packages": ["nvidia-driver-535", "nvidia-dkms-535"]}

    # Its own driver now: a re-run without the flag is not refused and changes nothing.
    for check in (False, True):
        rc, stats, msgs = play(env, cdir, tmp_path, driver(repos, "535.288.01"), check=check)
        assert rc == 0 and stats["changed"] == 0, (stats, msgs)


def test_secure_boot_stops_a_dkms_build_with_the_enrolment_steps(env, repos, node, tmp_path) -> None:
    name, cdir = node
    # The role's own driver moves with the lock (the patch flow: no replace flag), but under
    # Secure Boot an unsigned DKMS build would not load: stop before anything changes.
    copy_in(name, FIXTURES / "mokutil-secureboot-enabled", "/usr/local/sbin/mokutil")
    rc, stats, msgs = play(env, cdir, tmp_path, driver(repos, "535.309.01"))
    flat = " ".join(msgs.split())
    assert rc != 0 and stats["failures"] == 1, (stats, msgs)
    assert "Secure Boot is enabled (mokutil --sb-state: SecureBoot enabled)" in flat, msgs
    assert "unsigned DKMS build (nvidia-dkms-535)" in flat, msgs
    assert "mokutil --import /var/lib/dkms/mok.pub" in flat and '"Enroll MOK"' in flat, msgs
    assert "signed precompiled modules" in flat, msgs
    assert versions(cdir, name)["nvidia-driver-535"] == "535.288.01-1"

    # No mokutil (a container, no EFI): the role says so and goes on; the planned move is made.
    sh(cdir, name, "rm -f /usr/local/sbin/mokutil")
    seen: list[str] = []
    rc, stats, msgs = play(env, cdir, tmp_path, driver(repos, "535.309.01"), messages=seen)
    assert rc == 0 and stats["failures"] == 0, msgs
    assert any("no mokutil" in m for m in seen), seen
    assert versions(cdir, name) == {"nvidia-driver-535": "535.309.01-1", "nvidia-dkms-535": "535.309.01-1"}


def test_fabric_manager_installs_where_nvswitches_are(env, repos, node, tmp_path) -> None:
    name, cdir = node
    for _ in range(2):
        rc, stats, msgs = play(env, cdir, tmp_path, fabricmanager(NVSWITCH_LOCK), pci=PCI_IN_NODE)
        assert rc == 0 and stats["failures"] == 0, msgs
    assert stats["changed"] == 0, stats
    assert versions(cdir, name)["nvidia-fabricmanager-535"] == "535.309.01-1"
