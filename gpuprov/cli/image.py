"""`gpuprov image`: baked node images, one per version lock (bake, list, delete)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from gpuprov.cli import output as cli_output
from gpuprov.cli.options import output_option
from gpuprov.cli.registry import core
from gpuprov.console import Console
from gpuprov.errors import BadInput
from gpuprov.providers import facts, having


def _console():

    return Console()


@click.group()
def image() -> None:
    """Baked node images: a verified node captured for its version lock.

    \b
    `up` boots new nodes from the newest image baked for the cluster's lock
    (they converge with nothing to change); --image names one, --no-baked none.
      gpuprov image bake --from demo          # a node of a verified cluster
      gpuprov image bake                      # the whole flow on a new local node
      gpuprov image bake --provider aws --type p4d.24xlarge --copy-to us-west-2
      gpuprov image list [--provider aws --region R]
      gpuprov image delete REF --yes

    On aws the node is cleaned itself, captured as an AMI tagged with the lock
    (image and snapshots) and terminated: --from takes a node out of its cluster.
    """


def _providers() -> click.Choice:
    """The providers with images (the registry's facts)."""
    return click.Choice(having("images"))


# Without --provider: this machine's images (a provider with images and no regions).
LOCAL = next((n for n in having("images") if not facts(n).regions), having("images")[0])


def _no_region(provider: str, region: str | None, copy_to: tuple[str, ...] = (), flags: str = "--region") -> None:
    if (region or copy_to) and not facts(provider).regions:
        raise BadInput(f"{flags} {'are' if ' and ' in flags else 'is'} for "
                       f"{' or '.join(f'--provider {n}' for n in having('regions'))}")


def _asker(yes: bool, what: str) -> Callable[[str], bool]:
    def confirm(question: str) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            raise BadInput(f"{what}: pass --yes to confirm without a prompt")
        return click.confirm(question, default=False, err=True)

    return confirm


@image.command()
@click.option("--from", "from_", metavar="NAME", help="Bake a node of this cluster (verified first).")
@click.option("--node", metavar="N", help="With --from: this node (default: the first).")
@click.option("--type", "instance_type", metavar="TYPE",
              help="Without --from: launch one node of this type, bootstrap, verify, bake, remove it "
              "(default: docker-node).")
@click.option("--provider", type=_providers(), default=LOCAL, show_default=True,
              help="Without --from: where to bake.")
@click.option("--region", help="aws, without --from: the region to bake in.")
@click.option("--copy-to", "copy_to", metavar="REGION", multiple=True,
              help="aws: copy the image to this region too, tagged the same (repeatable).")
@click.option("--scheduler", type=click.Choice(["none", "slurm"]), default="none", show_default=True,
              help="Without --from: slurm bakes a Slurm node (slurmd, munge), the image an elastic cluster's "
              "dynamic nodes boot from (`up --max-count` on aws).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (aws: a node is terminated; "
              "--type launches one).")
@output_option
def bake(from_: str | None, node: str | None, instance_type: str | None, provider: str, region: str | None,
         scheduler: str, copy_to: tuple[str, ...], yes: bool, output: str) -> int:
    """Bake an image for a version lock, from a cluster's node or a new node."""
    copy_to = tuple(dict.fromkeys(copy_to))
    if from_ is not None:
        if instance_type or region:
            raise BadInput("--type and --region go without --from (a cluster's node has both)")
        if scheduler != "none":
            raise BadInput("--scheduler goes without --from (a cluster's node has the scheduler its cluster has)")
        result = core("image bake").bake_from(from_, node=node, console=_console(), copy_to=copy_to,
                                              confirm=_asker(yes, "baking terminates the node on aws"))
    else:
        if node is not None:
            raise BadInput("--node goes with --from NAME")
        _no_region(provider, region, copy_to, "--region and --copy-to")
        ask = _asker(yes, "baking launches a node that costs money")
        result = core("image bake").bake_type(instance_type or facts(provider).bake_type,
                                              provider_name=provider, console=_console(), region=region,
                                              copy_to=copy_to, slurm=scheduler == "slurm", confirm=lambda plan: ask(
                                                  f"Launch 1 x {plan.spec.instance_type} to bake an image?"))
    if output == "json":
        cli_output.emit_json(result.public())
    else:
        _table([result])
    return 0


@image.command(name="list")
@click.option("--provider", type=_providers(), default=LOCAL, show_default=True)
@click.option("--region", help="aws: the region to list (default: the configured one).")
@output_option
def list_(provider: str, region: str | None, output: str) -> int:
    """The baked images, oldest first."""
    _no_region(provider, region)
    found = core("image list").list_images(provider, region)
    if output == "json":
        cli_output.emit_json([i.public() for i in found])
    elif not found:
        click.echo("no baked images (`gpuprov image bake --from NAME` bakes a verified cluster's node)")
    else:
        _table(found)
    return 0


@image.command()
@click.argument("ref")
@click.option("--provider", type=_providers(), default=LOCAL, show_default=True)
@click.option("--region", help="aws: the image's region (default: the configured one).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete(ref: str, provider: str, region: str | None, yes: bool) -> int:
    """Delete a baked image (REF: its name or id, as `gpuprov image list` shows; aws: the AMI
    is deregistered and its snapshots deleted)."""
    _no_region(provider, region)
    if not _asker(yes, "deleting an image")(f"Delete baked image {ref}?"):
        raise BadInput("aborted; nothing was deleted")
    core("image delete").delete_image(ref, provider_name=provider, region=region, console=_console())
    return 0


def _table(rows: list[Any]) -> None:

    cli_output.table("baked images", ["image", "lock", "driver", "cuda", "from", "baked", "size"],
          [[i.ref, i.lock_hash, f"{i.lock.get('driver', '')} ({i.lock.get('source', '')})",
            i.lock.get("cuda", ""), i.source, i.created, "" if i.size_gib is None else f"{i.size_gib} GiB"]
           for i in rows])
