"""The local node image's build: where its script is, and the one line that says how to run it.

A checkout has scripts/build-node-image.sh (and `make host-setup`, which runs it); a wheel
carries the same script and the helpers it sources as package data, gpuprov/share/node-image/
(pyproject.toml), found here through importlib.resources. This module imports nothing of
gpuprov's, so any module may import it.
"""

from __future__ import annotations

import shlex
from importlib.resources import files
from pathlib import Path

SCRIPT = "build-node-image.sh"
# Next to the script, what it sources.
HELPERS = ("lib.sh",)
PACKAGED = ("share", "node-image")
_CHECKOUT = Path(__file__).resolve().parents[3]


def _in_checkout() -> Path | None:
    path = _CHECKOUT / "scripts" / SCRIPT
    return path if path.is_file() and (_CHECKOUT / "Makefile").is_file() else None


def script() -> Path | None:
    """The build script: a checkout's scripts/, else the installed package's data; None where
    neither is there (an install that left the package data out)."""
    found = _in_checkout()
    if found is not None:
        return found
    packaged = files("gpuprov").joinpath(*PACKAGED, SCRIPT)
    return Path(str(packaged)) if packaged.is_file() else None


# The suite the build script takes by default (and `make host-setup` builds).
DEFAULT_SUITE = "bookworm"


def build_hint(image: str | None = None, suite: str | None = None) -> str:
    """How to build the node image here, for an error message (one line): the default one, or
    ``image`` from Debian suite ``suite`` (trixie: `make node-image-trixie` in a checkout)."""
    path = script()
    if path is None:
        return ("its build script is not installed here: reinstall gpuprov (the wheel carries "
                f"gpuprov/share/node-image/{SCRIPT}) or run scripts/{SCRIPT} from a checkout")
    other = suite not in (None, DEFAULT_SUITE)
    run = (f"GPUPROV_NODE_SUITE={shlex.quote(str(suite))} " if other else "") + f"bash {shlex.quote(str(path))}"
    if other and image:
        run += f" {shlex.quote(image)}"
    target = f"node-image-{suite}" if other else "host-setup"
    also = f" (or `make {target}`)" if _in_checkout() is not None else ""
    return f"build it as root with `{run}`{also}: it needs debootstrap and Docker"
