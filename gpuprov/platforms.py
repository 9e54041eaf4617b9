"""The operating systems gpuprov's roles name, and which of them this suite proves.

One table, read by the aws provider (`up --os`, its default image), `gpuprov stack`, and the
tests that keep the roles' meta/main.yml and the READMEs honest. "Proven" means a run here
installs and verifies on it, as ``how`` names: for Debian 12 every role's molecule scenario and
the end-to-end suite (the node image gpuprov/node:bookworm); for Debian 13 one end-to-end test on
a local node (gpuprov/node:trixie) of the plays ``where`` names, and the molecule scenarios of the
roles it names (the same image). A platform that is only "claimed"
is named by the roles' metadata and accepted by their asserts, but no scenario here runs on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROVEN_BY = ("every role's molecule scenario and the docker end-to-end suite run on the node "
             "image gpuprov/node:bookworm")
# The tests that prove Debian 13, and what they prove (the roles whose meta/main.yml names trixie
# are those whose tasks run on a trixie node there).
DEBIAN13_TEST = "tests/e2e/test_debian13_e2e.py"
DEBIAN13_EC2_TEST = "tests/aws/test_debian13_ec2.py"
# The roles whose molecule scenario runs on gpuprov/node:trixie too (tests/molecule/scenarios.py
# DEBIAN13, its OS matrix; every other scenario there says why it runs on Debian 12 alone).
DEBIAN13_MOLECULE = ("container_runtime", "gpu_preflight", "microcode", "monitoring", "node_patch", "rdma", "slurm",
                     "spot_interruption")
PROVEN_BY_DEBIAN13 = (f"{DEBIAN13_TEST}: a local node of the image gpuprov/node:trixie gets the whole site of "
                      "source distro from Debian 13's archive (nvidia-kernel-dkms 550.163.01 built by DKMS, CUDA "
                      "12.4.131, NCCL 2.22.3, Docker 26.1.5 with the container toolkit, rdma-core 56.1, trixie's "
                      "microcode; cuDNN 9.10.2.21 from the artifact mirror) and verifies with no failure; the "
                      "molecule scenarios of "
                      f"{', '.join(DEBIAN13_MOLECULE)} run on that image too (converge, idempotence, check, "
                      f"probes); {DEBIAN13_EC2_TEST}: a trixie instance of the emulated EC2 boots, hands over its "
                      "host key and converges; NVIDIA's repository (DCGM, fabric manager, nccl-tests) is not "
                      "installed on it (no lock of NVIDIA's debian13 repository yet)")
CLAIMED = "claimed by the roles' metadata; no scenario here runs on it"


@dataclass(frozen=True)
class Platform:
    key: str  # the --os value, e.g. debian12
    distribution: str  # as Ansible's ansible_facts['distribution'] and galaxy meta name it
    version: str  # 12, 22.04
    codename: str  # galaxy meta's version name: bookworm, jammy
    proven: bool
    slurm: str = ""  # the Slurm its own archive ships (slurm-wlm): what `--scheduler slurm` installs
    how: str = ""  # what proves it here (proven only)
    where: str = ""  # what of gpuprov it proves, where that is not everything (proven only)
    aws: str = ""  # what of `up --provider aws` is proven on it, where not everything (proven with a where)

    @property
    def title(self) -> str:
        return f"{self.distribution} {self.version} ({self.codename})"

    def row(self) -> dict[str, Any]:
        return {"os": self.key, "name": self.title, "proven": self.proven, "slurm": self.slurm,
                "how": self.how if self.proven else CLAIMED}

    @property
    def proof(self) -> str:
        """'proven here' (with what it covers, where not everything) or 'claimed, not proven here'."""
        if not self.proven:
            return "claimed, not proven here"
        return f"proven here ({self.where})" if self.where else "proven here"


PLATFORMS: tuple[Platform, ...] = (
    # slurm: the slurm-wlm upstream version in each release's own archive (Debian 12: 22.05.8,
    # installed and run here; the Ubuntu ones as their archives list them).
    Platform("debian12", "Debian", "12", "bookworm", proven=True, slurm="22.05.8", how=PROVEN_BY),
    # Debian 13: its archive's packages are lock data (gpuprov.lock.os_lines; slurm-wlm 24.11.5-4+deb13u1,
    # checked on the test machine's package cache 2026-11-26), installed for real on a local node
    # by DEBIAN13_TEST (2026-11-27), and the scenarios of DEBIAN13_MOLECULE (Slurm and RDMA 2026-11-28,
    # the others 2026-12-01);
    # not on AWS.
    Platform("debian13", "Debian", "13", "trixie", proven=True, slurm="24.11.5", how=PROVEN_BY_DEBIAN13,
             where="local nodes: the whole site of --source distro; the molecule scenarios of the "
             + ", ".join(DEBIAN13_MOLECULE[:-1]) + f" and {DEBIAN13_MOLECULE[-1]} roles",
             aws=f"on the emulated EC2 ({DEBIAN13_EC2_TEST}): the launch, its user-data under trixie's cloud-init, "
                 "the host-key hand-over and the microcode and spot plays; its driver and cuda plays on local nodes"),
    Platform("ubuntu20.04", "Ubuntu", "20.04", "focal", proven=False, slurm="19.05.5"),
    Platform("ubuntu22.04", "Ubuntu", "22.04", "jammy", proven=False, slurm="21.08.5"),
    # Ubuntu 24.04: a lock OS (`stack --os ubuntu24.04`, gpuprov.lock.os_lines) whose package names are read
    # off NVIDIA's public documents for its ubuntu2404 repository; no node here installs them, so it
    # stays claimed until a run proves it.
    Platform("ubuntu24.04", "Ubuntu", "24.04", "noble", proven=False, slurm="23.11.4"),
)
BY_KEY = {p.key: p for p in PLATFORMS}
BY_CODENAME = {(p.distribution, p.codename): p for p in PLATFORMS}


def get(key: str) -> Platform:
    return BY_KEY[key]


def listing() -> list[dict[str, Any]]:
    """`gpuprov stack -o json`'s ``platforms``: every platform the roles name, proven first."""
    return [p.row() for p in sorted(PLATFORMS, key=lambda p: not p.proven)]


def summary() -> str:
    """One line for people: which are proven here, which only claimed."""
    proven = ", ".join(p.title + (f" ({p.where})" if p.where else "") for p in PLATFORMS if p.proven)
    claimed = ", ".join(p.title for p in PLATFORMS if not p.proven)
    return f"proven here: {proven}; claimed, not proven here: {claimed}"


def slurm_summary() -> str:
    """One line: the Slurm each platform's own archive gives `--scheduler slurm` (controller and
    nodes run the one version of their OS; a probe checks it)."""
    return "slurm (--scheduler slurm, the OS's own slurm-wlm): " + ", ".join(
        f"{p.distribution} {p.version} {p.slurm}" for p in PLATFORMS if p.slurm)
