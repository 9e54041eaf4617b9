"""`gpuprov types` and `gpuprov stack`: what gpuprov knows of instance types, and the version
lock it would pin for one. Registered on the command group by gpuprov/cli/app.py."""

from __future__ import annotations

from typing import Any

import click

from gpuprov import defaults
from gpuprov.cli import output as cli_output
from gpuprov.cli.options import DRIVER, GPU_SHARING, GPU_SHARING_HELP, PRICE, output_option
from gpuprov.console import Console
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.pricing import PURPOSES, SORTS


@click.command()
@click.option("--gpu", metavar="MODEL", help="Only types with this GPU (A100, H100, ...).")
@click.option("--gpus", type=click.IntRange(min=1, max=defaults.MAX_NODE_GPUS), metavar="N",
              help="Only types with at least N GPUs.")
@click.option("--min-gpu-mem", type=click.IntRange(min=1, max=defaults.MAX_GPU_MEM_GIB), metavar="GIB",
              help="Only types with at least GIB of memory per GPU.")
@click.option("--max-price", type=PRICE, metavar="USD", help="Only types that cost at most USD per instance-hour "
              "here (on-demand; with --spot, spot).")
@click.option("--spot", is_flag=True, help="Spot prices (EC2's spot price history, cheapest zone, as a "
              "--refresh with AWS credentials reads them) instead of on-demand.")
@click.option("--efa", is_flag=True, help="Only types with EFA.")
@click.option("--nvswitch", is_flag=True, help="Only types whose GPUs sit on NVSwitch (all-to-all NVLink).")
@click.option("--cuda", metavar="LINE", help="Only types whose GPUs this CUDA line drives (11.8, 12.9, 13.0).")
@click.option("--sort", type=click.Choice(SORTS), help="Order: price per GPU-hour (gpu-price, "
              "the default), per instance-hour (price), most GPUs first (gpus).")
@click.option("--for", "purpose", type=click.Choice(PURPOSES), help="training: NVSwitch and EFA "
              "first, then price per GPU-hour; inference: the cheapest type whose GPU memory fits --min-gpu-mem. "
              "Each row says why it is there (docs/cost.md).")
@click.option("--region", help="aws: whose prices (and EC2 facts) to show (default: AWS_DEFAULT_REGION, "
              "AWS_REGION, else us-east-1).")
@click.option("--refresh", is_flag=True, help="aws: read EC2's GPU types (DescribeInstanceTypes), their on-demand "
              "prices (Price List API) and spot prices (spot price history) for --region into the cache.")
@output_option
def types(gpu: str | None, gpus: int | None, min_gpu_mem: int | None, max_price: float | None, spot: bool,
          efa: bool, nvswitch: bool, cuda: str | None, sort: str | None, purpose: str | None,
          region: str | None, refresh: bool, output: str) -> int:
    """List the instance types gpuprov knows: GPUs, arch, EFA, NVSwitch, and a dated price.

    Prices: the live answers cached by --refresh (AWS Price List API, EC2 spot price
    history, with the time fetched), else gpuprov's bundled table (on-demand, with its date
    and each figure's public source). `-` is a price nobody confirmed: never a guess."""
    from gpuprov import catalog  # lazy: CLI start-up
    from gpuprov.pricing import regions, select  # lazy: CLI start-up

    region, _ = regions.chosen(region)
    need = select.Need(gpu=gpu, gpus=gpus, min_gpu_mem=min_gpu_mem, max_price=max_price, spot=spot, efa=efa,
                       nvswitch=nvswitch, cuda=cuda, purpose=purpose, sort=sort).check()
    if refresh:
        from gpuprov.pricing import live  # lazy: CLI start-up (boto3)

        try:
            for line in live.refresh(region):
                Console().say(line)
        except GpuprovError as exc:  # no credentials, no network: the cache and the table answer
            Console().say(f"warning: not refreshed: {exc}; showing what is cached and the bundled table "
                          f"({catalog.price_date()})")
    known = catalog.all_types(region)
    found, notes = select.offers(known, region, need)
    if gpu and not any((t.gpu_model or "").lower() == gpu.lower() for t in known):
        models = sorted({t.gpu_model for t in known if t.gpu_model})
        raise BadInput(f"no instance type with GPU '{gpu}'; known GPUs: {', '.join(models)}")
    unanswered = select.unanswered(known, region, need, found)
    if unanswered:  # nothing meets the filters, or --spot with no spot price here: one line, exit 2
        raise BadInput(unanswered)
    rows = [offer_row(o) for o in found]
    if output == "json":
        cli_output.emit_json(rows)
    else:
        cli_output.types_table(rows, region, spot, catalog.price_date(), notes)
    return 0


def offer_row(offer: Any) -> dict[str, Any]:
    """One `types` row (docs/json-output.md): the type's facts, its price here, why it is listed."""
    row = offer.itype.row()
    row["price"] = offer.price.public() if offer.price else None
    row["price_per_gpu_hour"] = round(offer.per_gpu, 4) if offer.per_gpu is not None else None
    row["why"] = list(offer.why)
    return row


def cuda_for_install(value: str | None, instance_type: str | None = None, source: str | None = None,
                     os: str | None = None, bootstrap: bool = False) -> str | None:
    """The CUDA line `up` was asked for (``--cuda``), refused (BadInput, one line, before
    anything is created) where it resolves (`gpuprov stack` shows its lock) but gpuprov does not
    install it yet. None: not asked. Without --cuda, an ``os`` whose default line gpuprov does
    not install yet (Debian 13's own 12.4) is refused the same way when ``bootstrap`` would
    install it (`--no-bootstrap` and `--dry-run` go on). (`provision` and `patch` keep the line
    of the cluster's lock: they take no --cuda.)"""
    if value is None:
        if not bootstrap or os in (None, defaults.DEFAULT_OS) or os not in defaults.LOCK_OS:
            return None
        from gpuprov.lock import cuda_lines, os_lines  # lazy: CLI start-up

        own = os_lines.default_cuda(os, source or defaults.DEFAULT_SOURCE)
        if not cuda_lines.is_installable(own, source or defaults.DEFAULT_SOURCE):
            raise BadInput(f"--os {os}: its CUDA line {own} resolves (`gpuprov stack --type {instance_type or 'TYPE'} "
                           f"--os {os} --source {source or defaults.DEFAULT_SOURCE}` shows its lock) but gpuprov "
                           "does not install it yet; launch without bootstrapping (--no-bootstrap) or plan "
                           "(--dry-run)")
        return None
    from gpuprov.lock import cuda_lines  # lazy: CLI start-up

    line = cuda_lines.spelled(value)
    if line not in cuda_lines.lines():
        return line  # the resolver refuses it with its rule (the GPUs' first CUDA, the lines there are)
    later = cuda_lines.not_installed_yet(line, instance_type or "TYPE", source,
                                         None if os in (None, defaults.DEFAULT_OS) else os)
    if later:
        raise BadInput(later)
    return line


@click.command()
@click.option("--type", "instance_type", required=True, metavar="TYPE", help="Instance type.")
@click.option("--cuda", metavar="LINE",
              help="CUDA line: 11.8 (the default), 12.9 or 13.0 (12 and 13, or 13.x, name the one line of "
              "that major); 12.4 with --os debian13 --source distro (Debian 13's own, its default there); "
              "12.9 (the default there) or 13.0 with --os ubuntu24.04 (13.0 only with --source mirror). "
              "Every line resolves here; up installs 11.8, and 13.0 with --source mirror.")
@click.option("--driver", type=DRIVER, metavar="BRANCH", help="Driver branch (580) or exact release "
              "(default: the newest supported long-term branch for the type).")
@click.option("--kernel-module", type=click.Choice(defaults.KERNEL_MODULES), help="Default: from the GPU.")
@click.option("--source", type=click.Choice(defaults.PACKAGE_SOURCES), default=defaults.DEFAULT_SOURCE,
              show_default=True, help="Package source the nodes install from.")
@click.option("--os", "os_name", type=click.Choice(defaults.LOCK_OS), default=defaults.DEFAULT_OS, show_default=True,
              help="Whose packages the lock names: Debian 12's, Debian 13's (trixie: --source distro only; "
              "proven here on local nodes: its os note names the plays and roles), or Ubuntu 24.04's "
              "(noble: NVIDIA's ubuntu2404 repository, --source nvidia or mirror; claimed, not proven here).")
@click.option("--gpu-sharing", type=GPU_SHARING, metavar="MODE", help=GPU_SHARING_HELP)
@output_option
def stack(instance_type: str, cuda: str | None, driver: str | None, kernel_module: str | None, source: str,
          os_name: str, gpu_sharing: str | None, output: str) -> int:
    """Show the version lock for a type: driver (branch, its end of life, kernel module), fabric
    manager, CUDA, cuDNN, NCCL, EFA, and GPU sharing (--gpu-sharing).

    Also which operating systems the roles are proven on here (Debian 12; Debian 13 with --source
    distro: the whole site on a local node, `make test-debian13`) and which they only claim (Ubuntu)."""
    from gpuprov import platforms  # lazy: CLI start-up
    from gpuprov.lock import stack as stack_mod  # lazy: CLI start-up
    from gpuprov.sharing import layouts  # lazy: CLI start-up

    lock = stack_mod.resolve(instance_type, cuda=cuda, driver=driver, source=source, kernel_module=kernel_module,
                             os=os_name, gpu_sharing=gpu_sharing)
    cli_output.eol_warning(lock.as_dict())
    data = lock.public()
    if output == "json":
        cli_output.emit_json(data)
    else:
        # The table has no platform row of its own: the platforms come last, as a note.
        mine = platforms.get(lock.os)
        said = f"os: {mine.title}, {mine.proof}"
        notes = [*data["notes"], said, f"platform: {platforms.summary()}", platforms.slurm_summary()]
        cli_output.stack_table(instance_type, {**data, "gpu_sharing": layouts.words(data["gpu_sharing"]),
                                               "notes": notes})
    return 0
