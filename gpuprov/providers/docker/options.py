"""The docker provider's own `up` flags."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.providers import ProviderOptions, flag


@dataclass(frozen=True)
class DockerOptions(ProviderOptions):
    image: str | None = flag("--image")
    no_baked: bool = flag("--no-baked", False)


OPTIONS = DockerOptions
