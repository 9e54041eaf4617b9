"""Running one role's molecule scenario for real (docker driver, systemd node image): the
helpers of tests/molecule/test_scenarios.py (the fixture repository is in conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, require_docker

SCENARIOS = sorted(
    (p.parent.parent.parent.name, p.parent.name)
    for p in (ROOT / "roles").glob("*/molecule/*/molecule.yml")
)

# The OS matrix: every scenario runs on Debian 12's node image; those below run on Debian 13's
# (gpuprov/node:trixie) too, where the role's tasks, packages or services differ there (the
# preflight's OS and kernel header rules; trixie's docker.io 26.1.5, whose command line is a package
# of its own, and what runs on it: the monitoring containers; its
# own rdma-core; its microcode pins, installed by the microcode role and moved by the patch play;
# Python 3.13 for the spot interruption watcher; Slurm 24.11.5 against 22.05.8).
# Every other scenario says here why it runs on Debian 12 alone. A role whose scenario runs on
# Debian 13 lists trixie in its meta/main.yml platforms (test_scenarios.py holds it so), and
# gpuprov/platforms.py DEBIAN13_MOLECULE names the same roles.
DEBIAN13 = ("container_runtime:default", "gpu_preflight:default", "microcode:default", "monitoring:default",
            "node_patch:default", "rdma:default", "slurm:default", "spot_interruption:default")
_E2E = ("Debian 13's real {what} is installed and proven by tests/e2e/test_debian13_e2e.py "
        "(`make test-debian13`: its DKMS build and 2.5 GB toolkit are past `make test`'s time)")
DEBIAN12_ONLY = {
    "base_images:default": "Debian 13's CUDA line (12.4) pins no base image (its images are named by tag, not pinned "
                           "by digest), so the role pulls and builds nothing there; on Debian 12 it pulls and builds "
                           "with the node's Docker",
    "cuda:archives": "NVIDIA's redist archives are the same files on every OS, unpacked by the same tasks",
    "cuda:default": _E2E.format(what="CUDA 12.4 toolkit and NCCL"),
    "cudnn:default": "cuDNN's archive is the same files on every OS, unpacked by the same tasks; Debian 13's "
                     "(cuDNN 9 for CUDA 12) is installed and proven by tests/e2e/test_debian13_e2e.py",
    "dcgm:default": "DCGM comes from NVIDIA's repository layout (the FIXTURE repository here): the same packages "
                    "on every Debian",
    "gpu_sharing:default": "its node program reads the GPUs through nvidia-smi (a FIXTURE answering from a recorded "
                           "H100 here) and systemctl, and writes two systemd units: no task reads the OS's packages "
                           "or release",
    "gpuprov_base:default": "its facts and its pinned-key repository tasks read the OS's release files and run "
                            "apt's own commands alike on every Debian; Debian 13 runs it through the preflight "
                            "scenario here and tests/e2e/test_debian13_e2e.py",
    "gpuprov_lock:default": "maps the lock's fields to the roles' variables: no task reads the OS",
    "nccl_tests:default": "builds NVIDIA's nccl-tests against the lock's NCCL and MPI: Debian 13's NCCL line "
                          "(2.22.3, CUDA 12.4) pins no nccl-tests release",
    "nvidia_driver:default": _E2E.format(what="R550 driver with its DKMS build"),
    "slurm:accounting": "slurmdbd and MariaDB from the distribution by the same tasks as Slurm's own packages; "
                        "Debian 13's Slurm is the default scenario's (its MariaDB 11.8 and slurmdbd 24.11.5 are "
                        "claimed, not proven here)",
    "nvidia_fabricmanager:default": "fabric manager comes from NVIDIA's repository layout (the FIXTURE repository "
                                    "here): the same packages and unit on every Debian",
}
# Scenarios `make test` leaves to `make test-extended` (tests/conftest.py, the extended suite),
# each with what proves the same code in `make test`.
_SITE = ("the {role} role with these variables on Debian 12 is converged for real by the whole site on "
         "tests/e2e/test_docker_cluster.py's node from scratch (its probes pass there), converged again with changed 0 "
         "(test_up_again_resumes_where_it_stopped_and_is_idempotent), in check mode with changed 0 and on nodes from the "
         "baked image (tests/e2e/test_baked_cluster.py): the scenario's converge, idempotence, check and verify, on a "
         "real node; left out of `make test` on 2026-12-02, when the suite outgrew CI's 90 minutes on a slower 2-core "
         "AMD EPYC")
EXTENDED = {
    **{f"{role}:default": _SITE.format(role=role)
       for role in ("gpu_preflight", "cudnn", "container_runtime", "base_images", "microcode")},
    "nvidia_driver:default": "the driver role from the signed FIXTURE mirror (source mirror): in `make test` "
                             "tests/e2e/test_cluster_faults.py's two nodes install and hold it by the same play and "
                             "converge again after a killed run, and tests/roles/test_repo_trust.py installs, holds and "
                             "moves it through the pinned key; left out on 2026-12-02 (CI's time on a slower AMD EPYC)",
    "nvidia_fabricmanager:default": "fabric manager from the FIXTURE repository: in `make test` "
                                    "tests/roles/test_repo_trust.py finds a mismatched fabric manager on a node and "
                                    "fixes it, and the role's refusal without NVSwitch is its unit tests' and "
                                    "tests/e2e/test_patch_e2e.py's lock; left out on 2026-12-02 (CI's time)",
    "node_patch:default": "playbooks/patch.yml's kernel and microcode patch: in `make test` tests/e2e/test_patch_e2e.py "
                          "runs the same play on a three-node fleet (its kernel guard, its no-op, its check); left out "
                          "on 2026-12-02 (CI's time)",
    "gpuprov_base:default": "gpuprov_base's facts run in every play of every e2e run in `make test`, and its "
                            "pinned-key repository tasks are tests/roles/test_repo_trust.py's (a pinned install, "
                            "a keyring holding another key, a repository signed with another key); left out on "
                            "2026-12-02 (CI's time)",
    "gpuprov_lock:default": "the lock's fields as the roles' variables: tests/unit/test_lock_mapping.py in `make test`, "
                            "and every e2e run there converges through it; left out on 2026-12-02 (CI's time)",
    "spot_interruption:default": "the spot watcher on Debian 12: in `make test` tests/aws/test_ec2_headline.py's four "
                                 "spot nodes install it and one notices an interruption through IMDSv2, and "
                                 "tests/e2e/test_pull_aws_e2e.py converges its play; left out on 2026-12-02 (CI's time)",
    "slurm:accounting": "slurmdbd with MariaDB by the slurm role on Debian 12: tests/e2e/test_slurm_e2e.py converges "
                        "it for real in `make test` (two nodes, accounting on by default: jobs of two users "
                        "recorded with their TRES, the records kept through a second provision and a restart of "
                        "slurmdbd and MariaDB, converged again with the manifest's run); its own converge, "
                        "idempotence and check run by hand (`molecule test -s accounting`) and in "
                        "`make test-extended`",
    "slurm:default": "the slurm role on Debian 12: in `make test` tests/e2e/test_slurm_e2e.py converges it on two "
                     "nodes and runs jobs across them, and tests/e2e/test_patch_e2e.py converges it on a three-node "
                     "fleet and drains and resumes through it; left out on 2026-12-02 (CI's time)",
    "cuda:default": "Debian 12's nvidia-cuda-toolkit by the cuda role alone (a 2 GB install, about 4 minutes of "
                    "two cores); in `make test` the same role installs the same package on "
                    "tests/e2e/test_docker_cluster.py's node from scratch, whose whole site converges again with "
                    "changed 0 (a node from its baked image) and in check mode, and the cuda probes pass there; "
                    "the cuda role's scenario in `make test` is cuda:archives",
    "container_runtime:default:debian13": "Docker from Debian 13's archive (docker.io and its docker-cli) and the "
                                          "toolkit from the FIXTURE repository on Debian 13's node image (about a "
                                          "minute and a half); in `make test` the same tasks on Debian 12",
    "gpu_preflight:default:debian13": "the preflight on Debian 13's node image (about 2 minutes of two cores); in "
                                      "`make test` the same tasks on Debian 12, and Debian 13's kernel-header and "
                                      "OS rules in tests/unit (test_stack_os.py, test_kernel_compiler.py)",
    "microcode:default:debian13": "the microcode role at Debian 13's pins (stack data [os.debian13.sources.distro] "
                                  "microcode) on Debian 13's node image; in `make test` the same tasks at Debian 12's "
                                  "pins",
    "monitoring:default:debian13": "the exporters and Prometheus as containers of Debian 13's Docker 26.1.5 (about "
                                   "a minute); in `make test` the same tasks on Debian 12's Docker 20.10",
    "node_patch:default:debian13": "playbooks/patch.yml's kernel and microcode patch on Debian 13's node image, with "
                                   "Debian 13's lock (R550, trixie's microcode pins; about 45 s); in `make test` "
                                   "the same play on Debian 12",
    "rdma:default:debian13": "the rdma role on Debian 13's own rdma-core (about 2 minutes of two cores); in `make "
                             "test` the same tasks on Debian 12",
    "slurm:default:debian13": "the slurm role on Debian 13 (Slurm 24.11.5, about 4 minutes of two cores); in "
                              "`make test` the slurm role runs on Debian 12 (its scenario, and "
                              "tests/e2e/test_slurm_e2e.py)",
    "spot_interruption:default:debian13": "the interruption watcher under Debian 13's Python 3.13 and systemd 257 "
                                          "(about 25 s); in `make test` the same role on Debian 12's Python 3.11",
}
OS_IMAGES = {"debian12": "gpuprov/node:bookworm", "debian13": "gpuprov/node:trixie"}
MATRIX = [(role, scenario, os_name) for role, scenario in SCENARIOS for os_name in OS_IMAGES
          if os_name == "debian12" or f"{role}:{scenario}" in DEBIAN13]


def unit_of(role: str, scenario: str, os_name: str) -> str:
    """The scenario's name in test ids and xdist groups: ROLE:SCENARIO, :debian13 on Debian 13."""
    return f"{role}:{scenario}" + ("" if os_name == "debian12" else f":{os_name}")


# Molecule finds it on its own at the repository root; the runner passes it anyway,
# so a copy of the tree without its .git (molecule's root search) runs the same.
BASE_CONFIG = ROOT / ".config" / "molecule" / "config.yml"


def node_name(role: str, scenario: str, os_name: str = "debian12") -> str:
    """The scenario's node container: gpuprov-molecule-ROLE, or -ROLE-SCENARIO past `default`,
    and -debian13 on Debian 13."""
    name = "gpuprov-molecule-" + role.replace("_", "-")
    name = name if scenario == "default" else f"{name}-{scenario.replace('_', '-')}"
    return name if os_name == "debian12" else f"{name}-{os_name}"


def node_image(os_name: str) -> str:
    """The node image of ``os_name``; Debian 13's is built when missing or stale (`make node-image-trixie`,
    about a minute), as tests/e2e/test_debian13_e2e.py builds it."""
    if os_name != "debian12":
        proc = subprocess.run(["make", "-s", "-C", str(ROOT), "node-image-trixie"], capture_output=True,
                              text=True, check=False, timeout=1800)
        assert proc.returncode == 0, f"make node-image-trixie failed: {proc.stderr[-2000:]}"
    return OS_IMAGES[os_name]


def run_scenario(role: str, scenario: str, tmp_path: Path, fixture_repo, os_name: str = "debian12") -> None:
    require_docker()
    if not os.environ.get("GPUPROV_ARTIFACT_MIRROR"):
        raise AssertionError("GPUPROV_ARTIFACT_MIRROR is not set: run through `make test` or `make molecule`")
    env = dict(os.environ)
    env["GPUPROV_FIXTURE_REPO_URL"] = fixture_repo.good_url
    env["GPUPROV_FIXTURE_REPO_FPR"] = fixture_repo.fingerprint
    mirror = env.get("GPUPROV_REGISTRY_MIRROR", "")
    if mirror and not env.get("GPUPROV_REGISTRY_DIGESTS"):
        # The fixture registry serves its own image under the lock's names: the roles must
        # pull the digests it serves (read from it here), not NVIDIA's from the lock.
        from gpuprov.lock import stack
        from tests.fixtures import registry

        env["GPUPROV_REGISTRY_DIGESTS"] = json.dumps(registry.digests(
            mirror.split("://", 1)[-1].rstrip("/"), list(stack.resolve(None, source="distro").base_images)))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["NO_COLOR"] = "1"
    # The node's container name (the base config's platform): one per scenario, since the
    # scenarios of one role are separate xdist groups and may run side by side.
    node = node_name(role, scenario, os_name)
    env["GPUPROV_MOLECULE_NODE"] = node
    env["GPUPROV_MOLECULE_IMAGE"] = node_image(os_name)
    env["GPUPROV_MOLECULE_OS"] = os_name
    # What the leading destroy the shared sequence no longer runs made sure of: no container
    # of this name (one left by an interrupted run), and molecule's state of this run alone
    # (a state left saying "created" would make molecule skip its create step).
    subprocess.run(["docker", "rm", "--force", "--volumes", node], capture_output=True, check=False)
    env["MOLECULE_EPHEMERAL_DIRECTORY"] = str(tmp_path / "molecule-state")
    log = tmp_path / "molecule.log"
    with log.open("w") as fh:
        proc = subprocess.run(
            ["molecule", "--base-config", str(BASE_CONFIG), "test", "--scenario-name", scenario],
            cwd=ROOT / "roles" / role, env=env, stdout=fh, stderr=subprocess.STDOUT,
            check=False, timeout=1800,
        )
    text = log.read_text()
    assert proc.returncode == 0, f"molecule test {unit_of(role, scenario, os_name)} failed:\n{text[-6000:]}"
    for step in ("create", "converge", "idempotence", "check", "verify"):
        assert f"{step}: Executed: Successful" in text, f"{step} did not run:\n{text[-3000:]}"
