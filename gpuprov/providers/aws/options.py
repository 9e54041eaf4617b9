"""The aws provider's own `up` flags (light: no boto3, so the command line and the other
providers can read it)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov.providers import ClusterSpec, ProviderOptions, flag


@dataclass(frozen=True)
class AwsOptions(ProviderOptions):
    region: str | None = flag("--region")
    image: str | None = flag("--image")
    no_baked: bool = flag("--no-baked", False)
    os: str | None = flag("--os")  # filled in with the default where no --image is given
    ssh_cidr: str | None = flag("--ssh-cidr")
    allow_wide_ssh_cidr: bool = flag("--allow-wide-ssh-cidr", False)
    spot: bool = flag("--spot", False)
    disk_gb: int | None = flag("--disk-gb")
    capacity_reservation: str | None = flag("--capacity-reservation")


OPTIONS = AwsOptions


def of(spec: ClusterSpec) -> AwsOptions:
    """``spec``'s options, as the aws provider's own (the provider checked their type)."""
    opts = spec.options
    if not isinstance(opts, AwsOptions):
        raise TypeError(f"an aws spec carries AwsOptions, not {type(opts).__name__}")
    return opts
