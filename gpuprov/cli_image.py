"""`gpuprov image`: baked node images, one per version lock (bake, list, delete)."""

from __future__ import annotations

from typing import Any

import click

from gpuprov.cli_options import output_option
from gpuprov.errors import BadInput


def _console():
    from gpuprov.core import Console

    return Console()


@click.group()
def image() -> None:
    """Baked node images: a verified node captured for its version lock.

    \b
    `up` boots new nodes from the newest image baked for the cluster's lock
    (they converge with nothing to change); --image names one, --no-baked none.
      gpuprov image bake --from demo          # a node of a verified cluster
      gpuprov image bake                      # the whole flow on a new local node
      gpuprov image list
      gpuprov image delete REF --yes
    """


@image.command()
@click.option("--from", "from_", metavar="NAME", help="Bake a node of this cluster (verified first).")
@click.option("--node", metavar="N", help="With --from: this node (default: the first).")
@click.option("--type", "instance_type", metavar="TYPE", default="docker-node", show_default=True,
              help="Without --from: launch one node of this type, bootstrap, verify, bake, remove it.")
@click.option("--provider", type=click.Choice(["docker"]), default="docker", show_default=True,
              help="Without --from: where to bake (docker; aws baking is not built yet).")
@output_option
def bake(from_: str | None, node: str | None, instance_type: str, provider: str, output: str) -> int:
    """Bake an image for a version lock, from a cluster's node or a new node."""
    from gpuprov import cli_output
    from gpuprov.core import baking

    if from_ is not None:
        result = baking.bake_from(from_, node=node, console=_console())
    else:
        if node is not None:
            raise BadInput("--node goes with --from NAME")
        result = baking.bake_type(instance_type, provider_name=provider, options={}, console=_console())
    if output == "json":
        cli_output.emit_json(result.public())
    else:
        _table([result])
    return 0


@image.command(name="list")
@output_option
def list_(output: str) -> int:
    """The baked images, oldest first."""
    from gpuprov import cli_output
    from gpuprov.core import baking

    found = baking.list_images("docker")
    if output == "json":
        cli_output.emit_json([i.public() for i in found])
    elif not found:
        click.echo("no baked images (`gpuprov image bake --from NAME` bakes a verified cluster's node)")
    else:
        _table(found)
    return 0


@image.command()
@click.argument("ref")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete(ref: str, yes: bool) -> int:
    """Delete a baked image (REF: its name or id, as `gpuprov image list` shows)."""
    from gpuprov.core import baking

    if not yes:
        if not click.get_text_stream("stdin").isatty():
            raise BadInput("deleting an image: pass --yes to confirm without a prompt")
        if not click.confirm(f"Delete baked image {ref}?", default=False, err=True):
            raise BadInput("aborted; nothing was deleted")
    baking.delete_image(ref, provider_name="docker", region=None, console=_console())
    return 0


def _table(rows: list[Any]) -> None:
    from gpuprov.cli_output import table

    table("baked images", ["image", "lock", "driver", "cuda", "from", "baked", "size"],
          [[i.ref, i.lock_hash, f"{i.lock.get('driver', '')} ({i.lock.get('source', '')})",
            i.lock.get("cuda", ""), i.source, i.created, "" if i.size_gb is None else f"{i.size_gb} GB"]
           for i in rows])
