"""How one `up`'s new nodes bootstrap (`--bootstrap push|pull|auto`), decided before anything is
created: what was asked, or (auto) pull above PULL_ABOVE nodes where the provider can serve pull
to them, push otherwise. Asked for pull where it cannot run: one line, exit 2."""

from __future__ import annotations

from gpuprov.errors import BadInput
from gpuprov.providers import ClusterSpec, Provider
from gpuprov.pull import choose
from gpuprov.settings import play_secrets


def mode_for(requested: str, provider: Provider, spec: ClusterSpec, bootstrap: bool) -> str:
    """The mode; BadInput where pull was asked for and cannot run. ``auto`` never refuses: where
    pull cannot run (no bootstrap, a secret the bundle would not carry, hosts that could not
    reach this machine's server) it pushes."""
    if requested == "auto" and not bootstrap:
        return "push"  # nothing bootstraps: auto has no mode to refuse
    channel = provider.supports("pull_channel")
    mode = choose(requested, provider.bootstrap_count(spec), channel or provider.supports("pull_address"))
    if mode != "pull":
        return mode
    try:
        _servable(provider, spec, bootstrap, channel)
    except BadInput:
        if requested == "auto":
            return "push"
        raise
    return mode


def _servable(provider: Provider, spec: ClusterSpec, bootstrap: bool, channel: bool) -> None:
    if not bootstrap:
        raise BadInput("--bootstrap pull says how nodes bootstrap; it cannot go with --no-bootstrap")
    if not (channel or provider.supports("pull_address")):
        raise BadInput(f"--bootstrap pull is not built for the {provider.name} provider yet; "
                       "use --bootstrap push")
    if play_secrets():
        raise BadInput("--bootstrap pull does not carry GPUPROV_REGISTRY_PASSWORD to the nodes "
                       "(the bundle holds no secret); use --bootstrap push")
    if not (provider.pull_at_boot or channel):
        provider.pull_address(spec, [])  # hosts that could not reach this machine: refused now
