"""CUDA 13.0 through the real CLI on a local node: `up --source mirror --cuda 13`.

What is real: the lock (driver R580, CUDA 13.0.2, cuDNN 9.17.1.4, NCCL 2.27.7), the SSH and
Ansible path, and CUDA itself: NVIDIA's redist archives from the local artifact mirror (rebuilt
from NVIDIA's wheels, each pinned by sha256), unpacked by the cuda and cudnn roles and proven
by the probes (nvcc V13.0.88 compiles for sm_75 and sm_120, cuDNN 9 and NCCL load and report
their versions). The cluster's mirror (`--source mirror` needs one) is the signed FIXTURE
repository with NVIDIA's package names (tests/fixtures/patchrepo.py), whose R580 driver is
what the lock names; the driver play is not run: CUDA needs no driver to compile, and the
driver plays are proven in test_docker_cluster.py and test_patch_e2e.py.

One node, the cuda play only (`--tags cuda`; the rest of the site runs for CUDA 11.8 in
test_docker_cluster.py and would prove nothing of CUDA 13 here): about three minutes on two
cores. `provision --check` and a second `provision` prove the archives' path changes nothing
on a converged node, as the cuda role's `archives` molecule scenario does for the role alone.
"""

from __future__ import annotations

import json
import secrets

import pytest

from tests.conftest import run_cli
from tests.e2e.nodes import cleanup_labels, node_sh

pytestmark = pytest.mark.e2e

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
        proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--cuda", "13",
                       "--source", "mirror", "--mirror-url", repo.url, "--mirror-key-fingerprint", repo.fingerprint,
                       "--tags", "cuda", "--health", "off", "--no-baked", "-o", "json",
                       env=env, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield name, json.loads(proc.stdout), proc.stderr
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)


def test_up_locks_cuda_13_from_the_mirrors_archives(cluster, env) -> None:
    name, data, _ = cluster
    assert data["bootstrap"]["ok"] is True, data["bootstrap"]
    lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert (lock["cuda"], lock["cuda_version"], lock["cudnn"], lock["nccl"]) == ("13.0", "13.0.2", "9.17.1.4", "2.27.7")
    assert (lock["driver_branch"], lock["source"]) == ("580", "mirror")
    assert lock["packages"]["cuda_method"] == "archives"
    assert [a["component"] for a in lock["cuda_archives"]] == ["cuda_nvcc", "cuda_cudart", "cuda_cccl", "nccl"]


def test_the_node_has_exactly_the_locked_archives(cluster) -> None:
    name, _, _ = cluster
    node = f"{name}-node-1"
    from gpuprov import cuda_lines

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


def test_check_and_a_second_provision_of_the_cuda_play_change_nothing(cluster, env) -> None:
    name, _, _ = cluster
    for extra in (["--check"], []):
        proc = run_cli("provision", name, "--tags", "cuda", *extra, "-o", "json", env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        hosts = json.loads(proc.stdout)["hosts"]
        assert {h: (s["changed"], s["failed"]) for h, s in hosts.items()} == {f"{name}-node-1": (0, 0)}, (extra, hosts)
