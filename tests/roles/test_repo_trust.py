"""The roles' repository and archive logic on a real node container, against the
fixture repository (tests/fixtures/aptrepo.py) and the local artifact mirror:
keyring placement and fingerprint pinning, signed-by sources, conflicting entries
removed, pinned versions and holds, a driver move with fabric manager following
it, and the refusals: a key that is not the pinned one, a repository signed with
another key, a cuDNN archive whose sha256 does not match.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import pytest

from gpuprov.lock import drivers, stack
from tests.conftest import run_cli
from tests.fixtures import aptrepo
from tests.roles.nodeplay import copy_in, play, sh

pytestmark = pytest.mark.e2e


# The lock of source nvidia (package names and versions as NVIDIA's repository has them).
NVIDIA_LOCK = stack.resolve("p4d.24xlarge", source="nvidia").as_dict()

# NVIDIA's R580 release gpuprov pins (its repository's packages from the 570 series on name a
# release pinning package).
R580 = stack.data()["driver"]["branches"]["580"]

# The recorded NVSwitch bus inside the node, read by gpuprov_base instead of sysfs.
FIXTURE_PCI = "/opt/gpuprov-fixture-pci"

@pytest.fixture(scope="module")
def repos():
    from gpuprov.providers.docker import bridge_gateway

    # With the branches' libraries as dependencies: a move of branch must take the old one out.
    r = aptrepo.start(bridge_gateway(), ["535.288.01", "535.309.01", R580], branch_libraries=True)
    yield r
    r.close()


@pytest.fixture(scope="module")
def node(env):
    name = f"trust-{secrets.token_hex(3)}"
    run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-bootstrap", "--no-baked",
            env=env, check=True)
    run_cli("inventory", name, env=env, check=True)  # renders inventory, pins host keys
    cdir = Path(env["GPUPROV_HOME"]) / "clusters" / name
    # Fabric manager installs only where NVSwitches are: this node gets the fixture PCI bus of
    # an HGX H100 board (tests/roles/fixtures/pci/README.md says what was edited).
    sh(cdir, name, "mkdir -p /opt")
    copy_in(name, Path(__file__).parent / "fixtures/pci/hgx-h100-nvswitch", FIXTURE_PCI)
    yield name, cdir
    run_cli("down", name, "--yes", env=env)


def driver_roles(url: str, fingerprint: str, version: str, key_url: str = "",
                 packages: list[str] | None = None, pinning: str = "") -> list[dict]:
    return [
        {"role": "nvidia_driver", "vars": {
            "nvidia_driver_source": "mirror", "nvidia_driver_mirror_url": url,
            "nvidia_driver_mirror_key_url": key_url or f"{url}repo.key",
            "nvidia_driver_mirror_key_fingerprint": fingerprint,
            "nvidia_driver_version": version,
            "nvidia_driver_packages": packages or ["nvidia-driver-535", "nvidia-dkms-535"],
            "nvidia_driver_pinning_package": pinning,
            "nvidia_driver_package_version": f"{version}-*"}},
        {"role": "nvidia_fabricmanager", "vars": {
            # NVIDIA's name: the branch's through R575, nvidia-fabricmanager from R580
            "nvidia_fabricmanager_package": drivers.fabricmanager_package(
                drivers.data()["sources"]["mirror"], version.split(".")[0]),
            "nvidia_fabricmanager_version": version,
            "nvidia_fabricmanager_package_version": f"{version}-*"}},
        # cuDNN from NVIDIA's repository as the lock of source nvidia names it.
        {"role": "cudnn", "vars": {"cudnn_method": "packages", "cudnn_packages": NVIDIA_LOCK["packages"]["cudnn"],
                                   "cudnn_package_version": NVIDIA_LOCK["packages"]["cudnn_version"]}},
    ]


def test_pinned_repository_install_hold_and_move(env, repos, node, tmp_path) -> None:
    name, cdir = node
    # A leftover entry for the same repository, as cuda-keyring or an old guide leaves it.
    sh(cdir, name, f"echo 'deb {repos.good_url} /' > /etc/apt/sources.list.d/cuda-debian12-x86_64.list")

    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.288.01"))
    assert rc == 0 and stats["failures"] == 0, msgs
    keyring = sh(cdir, name, "gpg --show-keys --with-colons /etc/apt/keyrings/gpuprov-nvidia-mirror.gpg")
    assert f":{repos.fingerprint}:" in keyring
    source = sh(cdir, name, "cat /etc/apt/sources.list.d/gpuprov-nvidia-mirror.sources")
    assert f"URIs: {repos.good_url}" in source
    assert "Signed-By: /etc/apt/keyrings/gpuprov-nvidia-mirror.gpg" in source
    assert sh(cdir, name, "ls /etc/apt/sources.list.d/").split() == ["gpuprov-nvidia-mirror.sources"]
    assert not sh(cdir, name, "grep -rl 'trusted=yes' /etc/apt/ 2>/dev/null; ls /etc/apt/trusted.gpg 2>/dev/null")
    versions = sh(cdir, name, "dpkg-query -W nvidia-driver-535 nvidia-dkms-535 nvidia-fabricmanager-535 "
                              "libcudnn8 libcudnn8-dev")
    assert "nvidia-driver-535\t535.288.01-1" in versions
    assert "nvidia-fabricmanager-535\t535.288.01-1" in versions
    assert "libcudnn8-dev\t8.9.6.50-1+cuda11.8" in versions
    held = set(sh(cdir, name, "apt-mark showhold").split())
    assert {"nvidia-driver-535", "nvidia-dkms-535", "nvidia-fabricmanager-535", "libcudnn8",
            "libcudnn8-dev"} <= held

    # Converged: a second run changes nothing.
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.288.01"))
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)

    # A new lock moves the held driver, and fabric manager moves with it.
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.309.01"))
    assert rc == 0, msgs
    versions = sh(cdir, name, "dpkg-query -W nvidia-driver-535 nvidia-fabricmanager-535")
    assert "nvidia-driver-535\t535.309.01-1" in versions
    assert "nvidia-fabricmanager-535\t535.309.01-1" in versions
    assert {"nvidia-driver-535", "nvidia-fabricmanager-535"} <= set(sh(cdir, name, "apt-mark showhold").split())


def test_fabric_manager_mismatch_found_on_a_node_is_fixed(env, repos, node, tmp_path) -> None:
    name, cdir = node
    sh(cdir, name, "apt-mark unhold nvidia-fabricmanager-535 >/dev/null; "
                   "apt-get install -y -q --allow-downgrades nvidia-fabricmanager-535=535.288.01-1 >/dev/null")
    assert "535.288.01-1" in sh(cdir, name, "dpkg-query -W nvidia-fabricmanager-535")
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.309.01"))
    assert rc == 0 and stats["changed"] >= 1, msgs
    assert "535.309.01-1" in sh(cdir, name, "dpkg-query -W nvidia-fabricmanager-535")


def test_key_that_is_not_the_pinned_one_is_refused(env, repos, node, tmp_path) -> None:
    _name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.other_fingerprint,
                                                         "535.309.01")[:1])
    assert rc != 0
    assert "refusing to trust" in msgs and repos.good_url in msgs and repos.other_fingerprint in msgs


def test_repository_signed_with_another_key_is_refused(env, repos, node, tmp_path) -> None:
    _name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.wrong_url, repos.fingerprint,
                                                         "535.309.01")[:1])
    assert rc != 0
    assert f"repository {repos.wrong_url} did not verify" in msgs, msgs


def test_cudnn_archive_with_wrong_checksum_is_refused_before_unpacking(env, node, tmp_path) -> None:
    name, cdir = node
    mirror = os.environ.get("GPUPROV_ARTIFACT_MIRROR")
    if not mirror:
        pytest.fail("GPUPROV_ARTIFACT_MIRROR is not set: run through `make test` (scripts/artifact-mirror.sh)")
    rc, _, msgs = play(env, cdir, tmp_path, [{"role": "cudnn", "vars": {
        "cudnn_method": "tarball",
        "cudnn_tarball_url": f"{mirror}/cudnn/cudnn-linux-x86_64-8.9.6.50_cuda11-archive.tar",
        "cudnn_tarball_sha256": "0" * 64}}])
    assert rc != 0 and re.search(r"checksum.*did not match|did not match", msgs), msgs
    assert not sh(cdir, name, "ls /usr/local/cuda-11.8/include/cudnn_version.h /var/cache/gpuprov/cudnn-linux-* 2>/dev/null")


PRIMARY_KEYS = ("gpg --batch --show-keys --with-colons {} 2>/dev/null | awk -F: "
                "'$1 == \"pub\" || $1 == \"sub\" {{ t = $1 }} $1 == \"fpr\" && t == \"pub\" {{ print $10; t = \"\" }}'")


def primary_keys(cdir, name: str, keyring: str) -> list[str]:
    return sh(cdir, name, PRIMARY_KEYS.format(keyring)).split()


# Finding 6: the key file may carry the pinned key plus another one; only the pinned key
# may reach the Signed-By keyring (before, the whole file was dearmored into it).
def test_bundled_key_file_installs_only_the_pinned_key(env, repos, node, tmp_path) -> None:
    name, cdir = node
    keyring = "/etc/apt/keyrings/gpuprov-nvidia-mirror.gpg"
    sh(cdir, name, f"rm -f {keyring}")
    roles = driver_roles(repos.good_url, repos.fingerprint, "535.309.01", repos.bundled_key_url)[:1]
    rc, stats, msgs = play(env, cdir, tmp_path, roles)
    assert rc == 0 and stats["failures"] == 0, msgs
    assert primary_keys(cdir, name, keyring) == [repos.fingerprint]
    assert repos.other_fingerprint not in sh(cdir, name, f"gpg --show-keys --with-colons {keyring}")
    # apt still verifies the repository with that keyring.
    update = sh(cdir, name, "apt-get update -q -o Dir::Etc::SourceList=/etc/apt/sources.list.d/"
                            "gpuprov-nvidia-mirror.sources -o Dir::Etc::SourceParts=- 2>&1; echo rc=$?")
    assert "rc=0" in update and not re.search(r"NO_PUBKEY|GPG error|not signed|^W:|^E:", update, re.M), update
    assert repos.good_url.rstrip("/") + "  Packages" in sh(cdir, name, "apt-cache policy nvidia-driver-535")
    # Converged: the keyring is right, nothing changes.
    rc, stats, msgs = play(env, cdir, tmp_path, roles)
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)


def test_keyring_holding_another_key_is_rewritten(env, repos, node, tmp_path) -> None:
    name, cdir = node
    keyring = "/etc/apt/keyrings/gpuprov-nvidia-mirror.gpg"
    # What the old role left: the whole bundled key file dearmored into the keyring.
    fetch = f"import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('{repos.bundled_key_url}').read().decode())"
    sh(cdir, name, f'python3 -c "{fetch}" | gpg --batch --yes --dearmor -o {keyring}')
    assert sorted(primary_keys(cdir, name, keyring)) == sorted([repos.fingerprint, repos.other_fingerprint])
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=driver_roles(repos.good_url, repos.fingerprint,
                                                             "535.309.01", repos.bundled_key_url)[:1])
    assert rc == 0 and stats["changed"] >= 1, (stats, msgs)
    assert primary_keys(cdir, name, keyring) == [repos.fingerprint]


def test_container_toolkit_repository_keyring_holds_only_the_pinned_key(env, repos, node, tmp_path) -> None:
    name, cdir = node
    # The fixture serves the toolkit from the driver tests' repository: drop their entry,
    # two entries for one URL with different Signed-By keyrings are an apt error.
    sh(cdir, name, "rm -f /etc/apt/sources.list.d/gpuprov-nvidia-mirror.sources")
    # The one pinned-repository task file, as container_runtime includes it for the toolkit.
    tasks = [{"name": "the toolkit repository", "ansible.builtin.include_role": {
        "name": "gpuprov_base", "tasks_from": "apt_repository"},
        "vars": {"gpuprov_base_repo": {"name": "nvidia-container-toolkit", "url": repos.good_url,
                                       "suites": "/", "key_url": repos.bundled_key_url,
                                       "fingerprint": repos.fingerprint}}}]
    rc, stats, msgs = play(env, cdir, tmp_path, [], tasks)
    assert rc == 0 and stats["failures"] == 0, msgs
    keyring = "/etc/apt/keyrings/gpuprov-nvidia-container-toolkit.gpg"
    assert primary_keys(cdir, name, keyring) == [repos.fingerprint]
    policy = sh(cdir, name, "apt-cache policy nvidia-container-toolkit 2>&1; ls /var/lib/apt/lists; "
                            "cat /etc/apt/sources.list.d/gpuprov-nvidia-container-toolkit.sources")
    assert "1.17.8-1" in policy, policy
    rc, stats, msgs = play(env, cdir, tmp_path, [], tasks)
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)
    # A key file without the pinned key is still refused, the keyring left as it was.
    sh(cdir, name, f"rm -f {keyring}")
    tasks[0]["vars"]["gpuprov_base_repo"]["key_url"] = f"{repos.wrong_url}repo.key"
    tasks[0]["vars"]["gpuprov_base_repo"]["fingerprint"] = repos.other_fingerprint
    rc, _, msgs = play(env, cdir, tmp_path, [], tasks)
    assert rc != 0 and "refusing to trust" in msgs, msgs
    assert not primary_keys(cdir, name, keyring)


def test_branch_and_flavour_move_replaces_the_old_packages(env, repos, node, tmp_path) -> None:
    """R535 proprietary to R580 open, NVIDIA's package names (fixture payloads): NVIDIA's release
    pin goes in first, the driver packages swap in one apt transaction, the old branch's DKMS
    package (which does not conflict with the new one) and fabric manager go out with their
    holds, the new ones are held and apt's pin moves to the new release; a second run changes
    nothing. Last in the file: it leaves the node on R580."""
    name, cdir = node
    rc, _, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI,
                       roles=driver_roles(repos.good_url, repos.fingerprint, "535.309.01"))
    assert rc == 0, msgs
    new = driver_roles(repos.good_url, repos.fingerprint, R580, packages=["nvidia-driver-580-open", "nvidia-dkms-580-open"],
                       pinning=f"nvidia-driver-pinning-{R580}")
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=new)
    assert rc == 0 and stats["failures"] == 0, msgs
    installed = sh(cdir, name, "dpkg-query -W -f='${db:Status-Abbrev}${Package}=${Version}\\n' 'nvidia-*' "
                               "| awk '/^.i/ { print $2 }'").split()
    assert sorted(installed) == sorted([f"nvidia-driver-580-open={R580}-1", f"nvidia-dkms-580-open={R580}-1",
                                        f"nvidia-fabricmanager={R580}-1", f"nvidia-driver-pinning-{R580}=1.0"])
    # The old branch's library came in as a dependency: apt's autoremove (limited to the role's
    # recorded packages) takes it out with its driver.
    libs = sh(cdir, name, "dpkg-query -W -f='${db:Status-Abbrev}${Package}=${Version}\\n' 'libnvidia-compute-*' "
                          "| awk '/^.i/ { print $2 }'").split()
    assert libs == [f"libnvidia-compute-580={R580}-1"], libs
    held = set(sh(cdir, name, "apt-mark showhold").split())
    assert {"nvidia-driver-580-open", "nvidia-dkms-580-open", "nvidia-fabricmanager"} <= held
    assert not {h for h in held if "535" in h}, held
    assert f"Pin: version {R580}-*" in sh(cdir, name, "cat /etc/apt/preferences.d/gpuprov-nvidia-driver.pref")
    record = sh(cdir, name, "cat /var/lib/gpuprov/nvidia_driver.json")
    assert f'"lock_packages": ["nvidia-driver-pinning-{R580}", "nvidia-driver-580-open", "nvidia-dkms-580-open"]' in record
    rc, stats, msgs = play(env, cdir, tmp_path, pci=FIXTURE_PCI, roles=new)
    assert rc == 0 and stats["changed"] == 0, (stats, msgs)
