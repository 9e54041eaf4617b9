"""`gpuprov slurm account add|list`: a Slurm cluster's accounts and users (sacctmgr on the
controller; docs/slurm.md, "Accounting")."""

from __future__ import annotations

import click

from gpuprov.cli.options import output_option
from gpuprov.cli.registry import core
from gpuprov.console import Console


@click.group()
def slurm() -> None:
    """A Slurm cluster's own records (docs/slurm.md)."""


@slurm.group()
def account() -> None:
    """Slurm accounts and their users, in the cluster's accounting database."""


@account.command(name="add")
@click.argument("name")
@click.argument("account_name", metavar="ACCOUNT")
@click.option("--user", "users", multiple=True, metavar="USER",
              help="A user to add to ACCOUNT (repeatable; at least one).")
def add(name: str, account_name: str, users: tuple[str, ...]) -> int:
    """Add ACCOUNT (where Slurm lacks it) and each --user to it: `sacctmgr -i add` on the
    controller over its pinned SSH connection; what is there already is said and left.

    Names: lowercase letters, digits, '_' and '-', starting with a letter, at most 32. The users
    must exist (same name and uid) on every node to run jobs.

    \b
    gpuprov slurm account add train research --user alice --user bob
    """
    core("slurm account add").add(name, account_name, list(users), console=Console())
    return 0


@account.command(name="list")
@click.argument("name")
@output_option
def list_(name: str, output: str) -> int:
    """The accounts Slurm's accounting knows, each with its users (`sacctmgr list associations`)."""
    data = core("slurm account list").listed(name)
    if output == "json":
        from gpuprov.cli.output import emit_json  # lazy: CLI start-up (the result shapes)

        emit_json(data)
        return 0
    click.echo(f"{data.cluster}: accounts (sacctmgr on {data.controller})")
    for entry in data.accounts:
        click.echo(f"{entry.account}\t{', '.join(entry.users) or '-'}")
    return 0
