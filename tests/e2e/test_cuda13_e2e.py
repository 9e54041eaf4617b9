"""CUDA 13.0 through the real CLI on a local node: a CUDA 11.8 node moved to 13.0 by
`patch --cuda 13`, as a fleet moves its line (`up --source mirror --cuda 13` runs the same
cuda and cudnn roles with the same lock; its lock is held by the unit and CLI tests).

What is real: the lock (driver R580, CUDA 13.0.2, cuDNN 9.17.1.4, NCCL 2.27.7), the SSH and
Ansible path, and CUDA itself: NVIDIA's redist archives from the local artifact mirror (rebuilt
from NVIDIA's wheels, each pinned by sha256), unpacked by the cuda and cudnn roles and proven
by the probes (nvcc V13.0.88 compiles for sm_75 and sm_120, cuDNN 9 and NCCL load and report
their versions). The cluster's mirror (`--source mirror` needs one) is the signed FIXTURE
repository with NVIDIA's package names (tests/fixtures/patchrepo.py), whose R580 driver is
what the lock names. The driver play runs for the repository it configures (the 11.8 toolkit's
packages come from it; its fake driver packages are what test_patch_e2e.py moves), and the
preflight for the node's package lists, as a site run leaves them (`patch --check` plans with
the lists the node has).

The node starts on CUDA 11.8 from the mirror: the FIXTURE repository's cuda-toolkit-11-8 (a
marker, no compiler: its nvcc probes fail before the move, which the roll's baseline records),
its NCCL 2.16.5 packages, and the real cuDNN 8.9.6 archive. `patch --cuda 13 --check` plans the
move and changes nothing; `patch --cuda 13` rolls it: the archives in, the 11.8 packages
unheld and removed, /usr/local/cuda-11.8 gone, the lock moved only then.

One node, the preflight, driver and cuda plays only (`--tags preflight,driver,cuda`; the rest
of the site runs for CUDA 11.8 in test_docker_cluster.py and would prove nothing of CUDA 13
here): about six minutes on two cores. A second `patch --cuda 13 --check` and a second
`provision` prove the moved node is what a converge of the new lock leaves (nothing to
change), as the cuda role's `archives` molecule scenario does for the role alone.
"""

from __future__ import annotations

import json
import secrets

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, node_sh

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "CUDA 11.8 -> 13.0 by `patch --cuda 13` on a local node (about 8 minutes of two cores); in `make test` "
    "the 13.0 archives are installed, converged again and probed by the cuda role's scenario "
    "(roles/cuda/molecule/archives), and the move's plan and lock by tests/unit/test_patch_cuda.py"))]

CUDA_PROBES = ("nvcc_reports_the_locked_cuda", "nvcc_compiles_for_the_locked_architectures",
               "cuda_prefix_and_environment", "cudnn_matches_the_lock", "nccl_matches_the_lock")


@pytest.fixture(scope="module")
def repo():
    from gpuprov.providers.docker import bridge_gateway
    from tests.fixtures import patchrepo

    r = patchrepo.start(bridge_gateway())
    yield r
    r.close()


@pytest.fixture(scope="module")
def cluster(env, repo):
    name = f"cu13-{secrets.token_hex(3)}"
    try:
        up = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--cuda", "11.8",
                     "--source", "mirror", "--mirror-url", repo.url, "--mirror-key-fingerprint", repo.fingerprint,
                     "--tags", "preflight,driver,cuda", "--health", "off", "--no-baked", "-o", "json",
                     env=env, timeout=1800)
        assert up.stdout.startswith("{"), up.stderr[-3000:]
        assert json.loads(up.stdout)["bootstrap"]["hosts"][f"{name}-node-1"]["failed"] == 0, up.stdout[-3000:]
        check = run_cli("patch", name, "--cuda", "13", "--check", "--health", "off", "-o", "json", env=env, timeout=900)
        assert check.returncode == 0, check.stderr[-3000:]
        moved = run_cli("patch", name, "--cuda", "13", "--health", "off", "-o", "json", env=env, timeout=1800)
        assert moved.returncode == 0, moved.stdout[-3000:] + moved.stderr[-3000:]
        yield name, json.loads(check.stdout), json.loads(moved.stdout)
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def test_patch_check_plans_the_move_and_changes_nothing(cluster) -> None:
    name, check, _ = cluster
    node = f"{name}-node-1"
    plan = check["hosts"][node]["plan"]
    assert plan[0].startswith("CUDA 11.8 -> 13.0 (NVIDIA's redist archives from the artifact mirror: cuda_nvcc"), plan
    assert [p.split()[0] for p in plan[1:]] == ["cuda-toolkit-11-8", "libnccl-dev", "libnccl2",
                                                "/usr/local/cuda-11.8"], plan
    assert check["lock"]["from"] != check["lock"]["to"]


def test_patch_moves_the_node_and_then_the_lock(cluster) -> None:
    name, check, moved = cluster
    node = f"{name}-node-1"
    assert moved["ok"] is True and moved["hosts"][node]["status"] == "patched", moved["hosts"][node]
    assert moved["lock"] == check["lock"]
    assert "cuda-toolkit-11-8 11.8.0-1 -> removed" in moved["hosts"][node]["moved"], moved["hosts"][node]


def test_the_old_line_is_gone_and_the_linker_finds_the_new_one(cluster) -> None:
    name, _, _ = cluster
    node = f"{name}-node-1"
    left = node_sh(node, "dpkg-query -W -f='${Package} ${Status}\\n' 'cuda-toolkit-11-8' 'libnccl*' 2>/dev/null "
                         "| grep ' installed$' || true")
    assert left.strip() == "", left
    assert node_sh(node, "test -e /usr/local/cuda-11.8 && echo present || echo absent").strip() == "absent"
    # The 13.0 libraries are what the dynamic linker finds now.
    libs = node_sh(node, "ldconfig -p | grep -E 'libnccl.so.2|libcudart.so' || true")
    assert "/usr/local/cuda/lib64/libnccl.so.2" in libs and "libcudart.so.13" in libs, libs


def test_a_second_move_to_the_same_line_has_nothing_to_do(cluster, env) -> None:
    name, _, _ = cluster
    proc = run_cli("patch", name, "--cuda", "13", "--check", "--health", "off", "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["lock"]["from"] == data["lock"]["to"]
    assert {h: s["status"] for h, s in data["hosts"].items()} == {f"{name}-node-1": "unchanged"}, data["hosts"]


def test_the_lock_is_cuda_13_from_the_mirrors_archives(cluster, env) -> None:
    name, _, _ = cluster
    lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert (lock["cuda"], lock["cuda_version"], lock["cudnn"], lock["nccl"]) == ("13.0", "13.0.2", "9.17.1.4", "2.27.7")
    assert (lock["driver_branch"], lock["source"]) == ("580", "mirror")
    assert lock["packages"]["cuda_method"] == "archives"
    assert [a["component"] for a in lock["cuda_archives"]] == ["cuda_nvcc", "cuda_cudart", "cuda_cccl", "nccl"]


def test_the_node_has_exactly_the_locked_archives(cluster) -> None:
    name, _, _ = cluster
    node = f"{name}-node-1"
    from gpuprov.lock import cuda_lines

    for archive in cuda_lines.own_archives("13.0"):
        marker = f"/usr/local/cuda-13.0/.gpuprov-{archive['component']}"
        if archive["component"] == "cudnn":
            marker = "/usr/local/cuda-13.0/.gpuprov-cudnn"
            want = f"9.17.1.4 {archive['sha256']}"
        else:
            want = f"{archive['archive']} {archive['sha256']}"
        assert node_sh(node, f"cat {marker}").strip() == want, archive
    assert "Cuda compilation tools, release 13.0, V13.0.88" in node_sh(node, "bash -lc 'nvcc --version'")
    assert node_sh(node, "readlink /usr/local/cuda").strip() == "/usr/local/cuda-13.0"


def test_verify_passes_the_cuda_probes(cluster, env) -> None:
    name, _, _ = cluster
    proc = run_cli("verify", name, "-o", "json", env=env, timeout=600)
    assert proc.stdout.startswith("{"), proc.stderr[-3000:]
    rows = {r["probe"]: r for r in next(iter(json.loads(proc.stdout)["hosts"].values()))}
    for probe in CUDA_PROBES:
        assert rows[probe]["status"] == "pass", rows[probe]
    assert "sm_75, sm_120" in rows["nvcc_compiles_for_the_locked_architectures"]["detail"]
    assert "libcudnn.so.9 loads and reports 91701" in rows["cudnn_matches_the_lock"]["detail"]
    assert "libnccl.so.2 loads and reports 22707" in rows["nccl_matches_the_lock"]["detail"]
    # No base image is pinned for CUDA 13.0: the image probes skip and say why.
    assert rows["base_images_present"]["status"] == "skip"
    assert "pins no base image for CUDA 13.0" in rows["base_images_present"]["detail"]


def test_a_second_provision_of_the_cuda_play_changes_nothing(cluster, env) -> None:
    """The patched node is what a converge of the new lock leaves (check mode said so above)."""
    name, _, _ = cluster
    proc = run_cli("provision", name, "--tags", "cuda", "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hosts = json.loads(proc.stdout)["hosts"]
    assert {h: (s["changed"], s["failed"]) for h, s in hosts.items()} == {f"{name}-node-1": (0, 0)}, hosts
