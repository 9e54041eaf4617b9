"""`gpuprov up --os` for every provider: aws launches that OS's image, docker boots its node image
(debian12: gpuprov/node:bookworm, debian13: gpuprov/node:trixie), static checks the claim against
each host's /etc/os-release; the lock's `os` is the one asked. Every OS a provider cannot run is
one line on stderr, exit 2, nothing created. (The trixie node itself, booted and bootstrapped:
tests/e2e/test_debian13_e2e.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov import defaults
from gpuprov.cli.stack import cuda_for_install
from gpuprov.errors import BadInput
from gpuprov.lock.stack_choice import StackChoice
from gpuprov.providers import options_for
from gpuprov.providers.docker import DEFAULT_IMAGE, NODE_IMAGES, PROVIDER, SUITES
from gpuprov.providers.docker.node_image import build_hint
from gpuprov.providers.static import check_os
from tests.cli.stack_lines import hosts_file, invoke, one_line_exit_2, state_of

TRIXIE = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\nVERSION_ID="13"\nID=debian\n'
BOOKWORM = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_ID="12"\nID=debian\n'
POINT = 'PRETTY_NAME="Debian GNU/Linux 12.7"\nVERSION_ID="12.7"\nID=debian\n'
JAMMY = 'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nVERSION_ID="22.04"\nID=ubuntu\n'
ROCKY = 'PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"\nVERSION_ID="9.4"\nID="rocky"\n'


def test_every_provider_takes_os_and_the_choices_are_the_constants() -> None:
    for provider in ("aws", "docker", "static"):
        assert options_for(provider, {"os": "debian13"}).os == "debian13"
    assert defaults.UP_OS == ("debian12", "debian13", "ubuntu22.04", "ubuntu24.04")
    assert set(defaults.LOCAL_OS) <= set(defaults.UP_OS) and set(defaults.AWS_OS) <= set(defaults.UP_OS)


def test_docker_boots_each_os_from_its_node_image(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NODE_IMAGES == {"debian12": "gpuprov/node:bookworm", "debian13": "gpuprov/node:trixie"}
    assert SUITES == {"debian12": "bookworm", "debian13": "trixie"}
    assert PROVIDER.image_for("debian13") == "gpuprov/node:trixie"
    assert PROVIDER.image_for(None) == PROVIDER.image_for("debian12") == PROVIDER.image
    # GPUPROV_NODE_IMAGE names the default OS's image only.
    monkeypatch.setattr(PROVIDER, "image", "mine/node:test")
    assert PROVIDER.image_for("debian12") == "mine/node:test" and PROVIDER.image_for("debian13") == NODE_IMAGES["debian13"]
    assert DEFAULT_IMAGE == NODE_IMAGES["debian12"]


def test_the_build_hint_names_the_suite_and_the_make_target() -> None:
    hint = build_hint("gpuprov/node:trixie", "trixie")
    assert hint.startswith("build it as root with `GPUPROV_NODE_SUITE=trixie bash ")
    assert "build-node-image.sh gpuprov/node:trixie`" in hint and "`make node-image-trixie`" in hint
    default = build_hint()
    assert "GPUPROV_NODE_SUITE" not in default and "`make host-setup`" in default


@pytest.mark.parametrize(("args", "needle"), [
    (["--provider", "docker", "--count", "1", "--os", "ubuntu22.04"],
     "--os ubuntu22.04: local nodes run debian12 or debian13 (node images gpuprov/node:bookworm, gpuprov/node:trixie)"),
    # (whose CUDA 12.9 does not install yet either: the missing node image is the nearer reason)
    (["--provider", "docker", "--count", "1", "--os", "ubuntu24.04"],
     "--os ubuntu24.04: local nodes run debian12 or debian13 (node images gpuprov/node:bookworm, gpuprov/node:trixie)"),
    (["--provider", "docker", "--count", "1", "--os", "debian13", "--source", "nvidia"],
     "--os debian13 with package source 'nvidia'"),
    (["--provider", "docker", "--count", "1", "--os", "debian13", "--source", "distro", "--kernel-module", "open"],
     "does not build against trixie's kernels"),
    (["--provider", "docker", "--count", "1", "--os", "debian13", "--source", "distro", "--cuda", "11.8"],
     "packages CUDA 12.4 only; use --cuda 12.4"),
])
def test_up_refuses_what_a_local_node_of_that_os_cannot_run(capsys, gpuprov_home: Path, args: list[str],
                                                           needle: str) -> None:
    before = _state(gpuprov_home)
    code, out, err = invoke(capsys, "up", "--name", "trixie", "--yes", *args)
    one_line_exit_2(code, out, err, needle)
    assert _state(gpuprov_home) == before


def _state(home: Path) -> list:
    """The store and the home's files, less the cluster's empty flock file (locks/NAME.lock):
    `up` takes it before the lock resolves, and it holds nothing."""
    return [row for row in state_of(home) if not (row[0] == "file" and row[1].startswith("locks/"))]


def test_an_unknown_os_is_clicks_one_line(capsys, gpuprov_home: Path) -> None:
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--name", "x", "--os", "debian99")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "Invalid value for '--os': 'debian99' is not one of 'debian12', 'debian13', 'ubuntu22.04', 'ubuntu24.04'" in err


def test_debian13s_own_cuda_line_is_installed_from_its_archive_alone() -> None:
    """CUDA 12.4 (trixie's nvidia-cuda-toolkit) is no longer refused for `up` with the distro
    source; every other source still refuses it."""
    assert cuda_for_install(None, "docker-node", "distro", os="debian13", bootstrap=True) is None
    assert cuda_for_install("12.4", "docker-node", "distro", os="debian13", bootstrap=True) == "12.4"
    assert StackChoice(cuda="12.4", source="distro").checked().cuda == "12.4"
    with pytest.raises(BadInput, match="does not install it yet"):
        StackChoice(cuda="12.4", source="nvidia").checked()


@pytest.mark.parametrize(("claimed", "release"), [
    ("debian13", TRIXIE), ("debian12", BOOKWORM), ("debian12", POINT), ("ubuntu22.04", JAMMY)])
def test_static_os_claim_that_holds(claimed: str, release: str) -> None:
    check_os("gpu01", claimed, release)


@pytest.mark.parametrize(("claimed", "release", "said"), [
    ("debian13", BOOKWORM, "gpu01: --os debian13 claims Debian 13 (trixie), but the host runs Debian GNU/Linux 12 "
                           "(bookworm); use --os debian12"),
    ("debian12", TRIXIE, "gpu01: --os debian12 claims Debian 12 (bookworm), but the host runs Debian GNU/Linux 13 "
                         "(trixie); use --os debian13"),
    ("debian12", ROCKY, "gpu01: --os debian12 claims Debian 12 (bookworm), but the host runs Rocky Linux 9.4 (Blue "
                        "Onyx); gpuprov's roles do not support it"),
    ("ubuntu22.04", "", "but the host runs no OS named by /etc/os-release; gpuprov's roles do not support it"),
])
def test_static_os_claim_that_fails_is_one_line(claimed: str, release: str, said: str) -> None:
    with pytest.raises(BadInput) as exc:
        check_os("gpu01", claimed, release)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_static_takes_os_as_a_claim_until_the_hosts_answer(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    """`up --provider static --os X --dry-run` plans with the lock of X (the claim is checked once
    the hosts answer)."""
    code, out, err = invoke(capsys, "up", "--provider", "static", "--hosts", hosts_file(tmp_path), "--name", "onprem",
                            "--os", "debian13", "--source", "distro", "--dry-run")
    assert code == 0, err
    assert "driver 550.163.01 (distro), CUDA 12.4" in " ".join((out + err).split())


def test_verify_of_a_cluster_takes_only_and_refuses_a_wrong_group_first(capsys, gpuprov_home: Path) -> None:
    """`verify NAME --only` (the groups of the plays `up --tags` ran: the Debian 13 e2e's way)
    checks the expression before the cluster is even looked up."""
    code, out, err = invoke(capsys, "verify", "nosuch", "--only", "drivr")
    one_line_exit_2(code, out, err, "--only 'drivr': unknown probe group 'drivr'")
    code, out, err = invoke(capsys, "verify", "nosuch", "--only", "driver or cuda")
    one_line_exit_2(code, out, err, "nosuch")
