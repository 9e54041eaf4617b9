"""The static provider's own `up` flags."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.providers import ProviderOptions, flag


@dataclass(frozen=True)
class StaticOptions(ProviderOptions):
    hosts_file: str | None = flag("--hosts")


OPTIONS = StaticOptions
