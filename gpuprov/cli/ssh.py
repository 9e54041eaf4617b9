"""`gpuprov ssh` and `gpuprov ssh-config`: log in to a node, or let OpenSSH do it by the node's name."""

from __future__ import annotations

import click

from gpuprov.cli.registry import core

# Where `ssh` keeps the words after the first `--` (RemoteCommand.parse_args).
REMOTE_WORDS = "gpuprov.ssh.words"


class RemoteCommand(click.Command):
    """Everything after the first ``--`` is the node's command, never NODE: click drops the
    ``--`` and would hand the command's first word to NODE (`gpuprov ssh demo -- hostname`
    would log in to a node named hostname)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[REMOTE_WORDS] = tuple(args[cut + 1:])
            args = args[:cut]
        return super().parse_args(ctx, args)


@click.command(name="ssh", cls=RemoteCommand)
@click.argument("name")
@click.argument("node", required=False)
@click.pass_context
def ssh_cmd(ctx: click.Context, name: str, node: str | None) -> int:
    """Log in to a node with OpenSSH, or run one command there (after --; exit: its exit code).

    NODE defaults to the Slurm controller on a Slurm cluster, else the first node. The
    connection is gpuprov's own: the cluster's pinned known_hosts, strict host key checking,
    the cluster's key, the node's user, address and port.

    \b
    gpuprov ssh demo
    gpuprov ssh demo demo-node-2
    gpuprov ssh demo -- sbatch --wrap hostname
    """
    words: tuple[str, ...] = ctx.meta.get(REMOTE_WORDS, ())
    return core("ssh").run(core("ssh").login(name, node, words))


@click.command(name="ssh-config")
@click.argument("name")
def ssh_config_cmd(name: str) -> int:
    """Print a Host entry per node for ~/.ssh/config, named as the node (ssh NODE, scp).

    Each entry: HostName, Port, User, IdentityFile, IdentitiesOnly, the cluster's pinned
    known_hosts and StrictHostKeyChecking yes. A value that is not one plain word is refused,
    and nothing is printed.

    \b
    gpuprov ssh-config demo >> ~/.ssh/config
    ssh demo-node-1
    """
    click.echo(core("ssh-config").ssh_config(name), nl=False)
    return 0
