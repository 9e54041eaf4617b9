"""`gpuprov types` and `gpuprov stack`: what gpuprov knows of instance types, and the version
lock it would pin for one. Registered on the command group by gpuprov/cli.py."""

from __future__ import annotations

import click

from gpuprov import cli_output, defaults
from gpuprov.cli_options import output_option
from gpuprov.errors import BadInput
from gpuprov.shared.console import Console


@click.command()
@click.option("--gpu", metavar="MODEL", help="Only types with this GPU (A100, H100, ...).")
@click.option("--region", help="aws: the region whose EC2 facts to show (and --refresh).")
@click.option("--refresh", is_flag=True, help="aws: read EC2's current GPU types (DescribeInstanceTypes) into the cache.")
@output_option
def types(gpu: str | None, region: str | None, refresh: bool, output: str) -> int:
    """List the instance types gpuprov knows (GPUs, arch, EFA, NVSwitch, price estimate).

    Facts come from EC2's DescribeInstanceTypes where cached (every aws `up`
    caches its type; --refresh reads all GPU types), and from gpuprov's
    bundled table for what that API lacks (NVSwitch, compute capability, price)."""
    from gpuprov import catalog  # lazy: CLI start-up

    if refresh:
        from gpuprov.providers.aws import refresh_catalog  # lazy: CLI start-up

        count, region = refresh_catalog(region)
        Console().say(f"cached {count} GPU instance type(s) of {region} from EC2")
    found = catalog.by_gpu(gpu, region=region)
    if gpu and not found:
        known = sorted({t.gpu_model for t in catalog.all_types(region) if t.gpu_model})
        raise BadInput(f"no instance type with GPU '{gpu}'; known GPUs: {', '.join(known)}")
    rows = [t.row() for t in found]
    if output == "json":
        cli_output.emit_json(rows)
    else:
        cli_output.types_table(rows, catalog.price_date())
    return 0


def cuda_for_install(value: str | None, instance_type: str | None = None) -> str | None:
    """The CUDA line `up` was asked for (``--cuda``), refused (BadInput, one line, before
    anything is created) where it resolves (`gpuprov stack` shows its lock) but gpuprov does not
    install it yet. None: not asked. (`provision` and `patch` keep the line of the cluster's
    lock: they take no --cuda.)"""
    if value is None:
        return None
    from gpuprov import cuda_lines  # lazy: CLI start-up

    line = cuda_lines.spelled(value)
    if line not in cuda_lines.lines():
        return line  # the resolver refuses it with its rule (the GPUs' first CUDA, the lines there are)
    later = cuda_lines.not_installed_yet(line, instance_type or "TYPE")
    if later:
        raise BadInput(later)
    return line


@click.command()
@click.option("--type", "instance_type", required=True, metavar="TYPE", help="Instance type.")
@click.option("--cuda", default=defaults.DEFAULT_CUDA, show_default=True, metavar="LINE",
              help="CUDA line: 11.8, 12.9 or 13.0 (12 and 13, or 13.x, name the one line of that "
              "major). Every line resolves here; up, provision and patch install 11.8 only.")
@click.option("--driver", metavar="BRANCH", help="Driver branch (580) or exact release (default: "
              "the newest supported long-term branch for the type).")
@click.option("--kernel-module", type=click.Choice(defaults.KERNEL_MODULES), help="Default: from the GPU.")
@click.option("--source", type=click.Choice(defaults.PACKAGE_SOURCES), default=defaults.DEFAULT_SOURCE,
              show_default=True, help="Package source the nodes install from.")
@output_option
def stack(instance_type: str, cuda: str, driver: str | None, kernel_module: str | None, source: str,
          output: str) -> int:
    """Show the version lock for a type: driver (branch, its end of life, kernel module), fabric manager, CUDA, cuDNN, NCCL, EFA.

    Also which operating systems the roles are proven on here (Debian 12) and which they only
    claim (Ubuntu)."""
    from gpuprov import platforms  # lazy: CLI start-up
    from gpuprov import stack as stack_mod  # lazy: CLI start-up

    lock = stack_mod.resolve(instance_type, cuda=cuda, driver=driver, source=source, kernel_module=kernel_module)
    cli_output.eol_warning(lock.as_dict())
    data = lock.public()
    if output == "json":
        cli_output.emit_json(data)
    else:
        # The table has no platform row of its own: the platforms come last, as a note.
        cli_output.stack_table(instance_type, {**data, "notes": [*data["notes"], f"platform: {platforms.summary()}",
                                                              platforms.slurm_summary()]})
    return 0
