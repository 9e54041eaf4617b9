"""The operating systems gpuprov's roles name, and which of them this suite proves.

One table, read by the aws provider (`up --os`, its default image), `gpuprov stack`, and the
tests that keep the roles' meta/main.yml and the READMEs honest. "Proven" means every role's
molecule scenario and the end-to-end suite run on it here (the node image gpuprov/node:bookworm,
Debian 12); a platform that is only "claimed" is named by the roles' metadata and accepted by
their asserts, but no scenario here runs on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROVEN_BY = ("every role's molecule scenario and the docker end-to-end suite run on the node "
             "image gpuprov/node:bookworm")


@dataclass(frozen=True)
class Platform:
    key: str  # the --os value, e.g. debian12
    distribution: str  # as Ansible's ansible_facts['distribution'] and galaxy meta name it
    version: str  # 12, 22.04
    codename: str  # galaxy meta's version name: bookworm, jammy
    proven: bool
    slurm: str = ""  # the Slurm its own archive ships (slurm-wlm): what `--scheduler slurm` installs

    @property
    def title(self) -> str:
        return f"{self.distribution} {self.version} ({self.codename})"

    def row(self) -> dict[str, Any]:
        return {"os": self.key, "name": self.title, "proven": self.proven, "slurm": self.slurm,
                "how": PROVEN_BY if self.proven else "claimed by the roles' metadata; no scenario "
                "here runs on it"}


PLATFORMS: tuple[Platform, ...] = (
    # slurm: the slurm-wlm upstream version in each release's own archive (Debian 12: 22.05.8,
    # installed and run here; the Ubuntu ones as their archives list them).
    Platform("debian12", "Debian", "12", "bookworm", proven=True, slurm="22.05.8"),
    # Debian 13: its archive's packages are lock data (gpuprov.os_lines; slurm-wlm 24.11.5-4+deb13u1,
    # checked on the test machine's package cache 2026-11-26); claimed until a node run proves it.
    Platform("debian13", "Debian", "13", "trixie", proven=False, slurm="24.11.5"),
    Platform("ubuntu20.04", "Ubuntu", "20.04", "focal", proven=False, slurm="19.05.5"),
    Platform("ubuntu22.04", "Ubuntu", "22.04", "jammy", proven=False, slurm="21.08.5"),
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
    proven = ", ".join(p.title for p in PLATFORMS if p.proven)
    claimed = ", ".join(p.title for p in PLATFORMS if not p.proven)
    return f"proven here: {proven}; claimed, not proven here: {claimed}"


def slurm_summary() -> str:
    """One line: the Slurm each platform's own archive gives `--scheduler slurm` (controller and
    nodes run the one version of their OS; a probe checks it)."""
    return "slurm (--scheduler slurm, the OS's own slurm-wlm): " + ", ".join(
        f"{p.distribution} {p.version} {p.slurm}" for p in PLATFORMS if p.slurm)
