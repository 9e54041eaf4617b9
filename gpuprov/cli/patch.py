"""`gpuprov patch`: roll driver, CUDA, kernel and microcode updates, or replace nodes from a baked image."""

from __future__ import annotations

import click

from gpuprov import defaults
from gpuprov.cli import output as cli_output
from gpuprov.cli.options import DRIVER, GPU_SHARING, GPU_SHARING_HELP, output_option
from gpuprov.cli.registry import core
from gpuprov.console import Console


@click.command()
@click.argument("name")
@click.option("--driver", type=DRIVER, metavar="VERSION|BRANCH", help="Move the driver to this branch or "
              "release (checked by the resolver; fabric manager follows).")
@click.option("--kernel-module", type=click.Choice(defaults.KERNEL_MODULES),
              help="Move the driver's kernel module flavour (old packages out, new ones in).")
@click.option("--cuda", metavar="LINE", help="Move the CUDA line (11.8, 13, ...): the toolkit, cuDNN and NCCL "
              "of the new line in, the old line's out (checked by the resolver against the driver).")
@click.option("--gpu-sharing", type=GPU_SHARING, metavar="MODE", help=GPU_SHARING_HELP + " patch checks it "
              "against the cluster's GPUs and records it in the lock once the roll ends well.")
@click.option("--kernel", is_flag=True, help="Apply kernel security updates.")
@click.option("--microcode", is_flag=True, help="Move CPU microcode to the lock's pin.")
@click.option("--all", "all_", is_flag=True, help="Driver (the lock's branch pin), kernel and microcode.")
@click.option("--batch", type=click.IntRange(min=1, max=defaults.MAX_NODES), default=1, show_default=True,
              metavar="N", help="Nodes per batch.")
@click.option("--check", is_flag=True, help="Print per node what would change; change nothing.")
@click.option("--drain", metavar="CMD", help="Shell command run here before each node (GPUPROV_NODE set).")
@click.option("--resume", metavar="CMD", help="Shell command run here after each healthy node.")
@click.option("--grace", type=click.IntRange(min=0, max=defaults.MAX_GRACE_S), metavar="SECONDS",
              help="Slurm clusters: how long a drained node's running jobs get to end before it is "
              "patched (default 1800); still running after it: the node is left drained, not patched, "
              "and the roll stops.")
@click.option("--force", is_flag=True, help="Slurm clusters: patch a drained node without waiting for "
              "its jobs (they may fail).")
@click.option("--no-reboot", is_flag=True, help="Never reboot; report the reboots needed.")
@click.option("--mirror-url", metavar="URL", help="The package mirror (clusters with source mirror).")
@click.option("--mirror-key-fingerprint", metavar="FPR", help="The mirror's pinned key fingerprint.")
@click.option("--health", default="quick", show_default=True, metavar="off|quick|standard", help="Health checks "
              "before the first batch and after each: a check failing only after the patch stops the roll.")
@click.option("--onto-image", metavar="REF|newest", help="Replace the nodes, a batch at a time, with new ones "
              "from this baked image of the new lock (newest: the newest one; none yet: baked first) instead "
              "of patching them in place.")
@click.option("--via", type=click.Choice(["push", "pull"]), default="push", show_default=True,
              help="Where the plays and probes run: push (Ansible from here over SSH) or pull (each node "
              "runs the roll's plays and probes itself from this gpuprov's bundle, in the same batches "
              "behind the same gates; its own run does not reboot it).")
@output_option
def patch(name: str, driver: str | None, kernel_module: str | None, cuda: str | None, gpu_sharing: str | None,
          kernel: bool, microcode: bool,
          all_: bool, batch: int, check: bool, drain: str | None, resume: str | None, grace: int | None,
          force: bool, no_reboot: bool,
          mirror_url: str | None, mirror_key_fingerprint: str | None, health: str, onto_image: str | None,
          via: str, output: str) -> int:
    """Roll driver, CUDA, kernel and microcode updates over the nodes, a batch at a time, with health gates:
    in place, or by replacing the nodes from a baked image (--onto-image)."""
    req = core("patch").request(all_=all_, driver=driver, kernel_module=kernel_module, cuda=cuda,
                                gpu_sharing=gpu_sharing, kernel=kernel, microcode=microcode, batch=batch, check=check,
                                reboot=not no_reboot, drain=drain, resume=resume, onto_image=onto_image,
                                grace=grace, force=force, mirror_url=mirror_url,
                                mirror_key_fingerprint=mirror_key_fingerprint, via=via)
    if onto_image is not None:
        data = core("patch --onto-image").roll_onto_image(name, req, console=Console(), health=health)
    else:
        data = core("patch").patch(name, req, console=Console(), health=health)
    if output == "json":
        cli_output.emit_json(data)
    else:
        cli_output.patch_table(name, check, data)
    if not check:
        cli_output.eol_warning_of(name)  # the lock the roll ended on
    return 0 if data.ok else 1
