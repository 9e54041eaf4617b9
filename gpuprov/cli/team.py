"""`gpuprov state`, `gpuprov unlock` and `gpuprov access`: a team's shared state on S3, a lock
whose holder cannot end it, and each operator's own SSH key on a cluster (docs/team-state.md)."""

from __future__ import annotations

from pathlib import Path

import click

from gpuprov.cli.registry import core
from gpuprov.console import Console
from gpuprov.errors import BadInput


@click.group()
def state() -> None:
    """The state a team shares: clusters' records, runs and locks under a prefix of an S3 bucket.

    \b
    gpuprov state bucket s3://team-gpu-state/fleet
    gpuprov settings --set state=s3://team-gpu-state/fleet   # this machine uses it
    gpuprov state push NAME          # a cluster recorded here, into it
    gpuprov state pull NAME          # a copy of its record here
    """


@state.command(name="bucket")
@click.argument("location", metavar="s3://BUCKET/PREFIX")
@click.option("--kms-key", metavar="KEY", help="Default encryption SSE-KMS with this key of the account "
              "(id, ARN or alias/NAME); without it, SSE-S3.")
def bucket_create(location: str, kms_key: str | None) -> int:
    """Make the bucket (Block Public Access, default encryption, versioning, a TLS-only policy),
    or check an existing one of this account; nothing else is changed."""
    core("state bucket").bucket_create(location, kms_key, Console())
    return 0


@state.command()
@click.argument("name")
@click.option("--to", "url", metavar="s3://BUCKET/PREFIX", help="The S3 state (default: the one chosen).")
def push(name: str, url: str | None) -> int:
    """Copy this machine's record of NAME into the S3 state (refused where the record there is
    newer). The SSH and munge keys stay here."""
    core("state push").push(name, url, Console())
    return 0


@state.command()
@click.argument("name")
@click.option("--from", "url", metavar="s3://BUCKET/PREFIX", help="The S3 state (default: the one chosen).")
def pull(name: str, url: str | None) -> int:
    """Copy the S3 state's record of NAME into this machine's (refused where the one here is newer)."""
    core("state pull").pull(name, url, Console())
    return 0


@click.command()
@click.argument("name")
@click.option("--force", is_flag=True, help="Break a live lock (its command then writes nothing more).")
def unlock(name: str, force: bool) -> int:
    """Remove a cluster's lock in the S3 state: one whose lease ran out, or with --force a live
    one, naming the command it breaks."""
    core("unlock").unlock(name, force, Console())
    return 0


@click.group()
def access() -> None:
    """Operators' own SSH public keys on a cluster, recorded in its record (shared by the team)."""


@access.command()
@click.argument("name")
@click.option("--key", "key_file", type=click.Path(dir_okay=False),
              help="The operator's public key file (one ed25519, ECDSA or RSA line). Required.")
@click.option("--as", "as_name", metavar="NAME", help="Whose key it is (lowercase name). Required.")
def grant(name: str, key_file: str | None, as_name: str | None) -> int:
    """Grant an operator's public key on a cluster."""
    if key_file is None or as_name is None:
        raise BadInput("gpuprov access grant NAME: --key FILE and --as NAME are both needed")
    entry = core("access grant").grant(name, Path(key_file), as_name)
    click.echo(f"{name}: granted {as_name} ({entry['fingerprint']}); `gpuprov provision {name}` puts it on the nodes")
    return 0


@access.command()
@click.argument("name")
@click.option("--as", "as_name", metavar="NAME", help="Whose grant to remove. Required.")
def revoke(name: str, as_name: str | None) -> int:
    """Remove an operator's grant from a cluster."""
    if as_name is None:
        raise BadInput("gpuprov access revoke NAME: --as NAME is needed")
    if not core("access revoke").revoke(name, as_name):
        click.echo(f"{name}: {as_name} had no grant")
        return 0
    click.echo(f"{name}: revoked {as_name}; `gpuprov provision {name}` takes the key off the nodes")
    return 0


@access.command(name="list")
@click.argument("name")
def list_(name: str) -> int:
    """The operators granted on a cluster: name, key fingerprint, by whom, when (and revoked)."""
    for who, entry in core("access list").listed(name).items():
        revoked = f"\trevoked by {entry['revoked_by']} at {entry['revoked_at']}" if entry.get("revoked_at") else ""
        click.echo(f"{who}\t{entry.get('fingerprint')}\tgranted by {entry.get('granted_by')} at "
                   f"{entry.get('at')}{revoked}")
    return 0
