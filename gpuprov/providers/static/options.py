"""The static provider's own `up` flags."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.providers import ProviderOptions, flag


@dataclass(frozen=True)
class StaticOptions(ProviderOptions):
    hosts_file: str | None = flag("--hosts")
    # A claim of what the hosts run (the lock's package facts are that OS's): checked against
    # each host's /etc/os-release once it answers (gpuprov.providers.static.check_os).
    os: str | None = flag("--os")


OPTIONS = StaticOptions
