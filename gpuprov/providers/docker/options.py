"""The docker provider's own `up` flags, and the node image of each OS they can name."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov import defaults
from gpuprov.errors import BadInput
from gpuprov.providers import ProviderOptions, flag

DEFAULT_IMAGE = "gpuprov/node:bookworm"
# The node image of each OS a local node runs (`up --os`, gpuprov.defaults.LOCAL_OS), built by
# scripts/build-node-image.sh from that release's suite (GPUPROV_NODE_SUITE).
NODE_IMAGES = {"debian12": DEFAULT_IMAGE, "debian13": "gpuprov/node:trixie"}
SUITES = {"debian12": "bookworm", "debian13": "trixie"}
assert tuple(NODE_IMAGES) == tuple(SUITES) == defaults.LOCAL_OS, "a node image and suite for each local OS"


def unimaged(os_name: str | None) -> str | None:
    """Why local nodes cannot run ``os_name`` (None: they can, or it names none)."""
    if os_name is None or os_name in NODE_IMAGES:
        return None
    return (f"--os {os_name}: local nodes run {' or '.join(NODE_IMAGES)} "
            f"(node images {', '.join(NODE_IMAGES.values())})")


@dataclass(frozen=True)
class DockerOptions(ProviderOptions):
    image: str | None = flag("--image")
    no_baked: bool = flag("--no-baked", False)
    os: str | None = flag("--os")  # None: the default OS's node image (gpuprov.defaults.LOCAL_OS)

    def __post_init__(self) -> None:
        # Refused with the flags, before anything asks what the OS's stack line installs.
        why = unimaged(self.os)
        if why:
            raise BadInput(why)


OPTIONS = DockerOptions
