"""The docker provider's own `up` flags."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.providers import ProviderOptions, flag


@dataclass(frozen=True)
class DockerOptions(ProviderOptions):
    image: str | None = flag("--image")
    no_baked: bool = flag("--no-baked", False)
    os: str | None = flag("--os")  # None: the default OS's node image (gpuprov.defaults.LOCAL_OS)


OPTIONS = DockerOptions
