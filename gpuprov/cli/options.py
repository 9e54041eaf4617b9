"""The flags of `gpuprov up`, the output flag every reading command takes, and what every
flag's value is held to when it is read (before a command does anything).

Which provider takes which flag is declared by each provider's options type
(gpuprov.providers.options_for); the --provider choices come from the registry, and every
default, closed list of choices and numeric bound from gpuprov.defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from gpuprov import defaults, validate
from gpuprov.errors import BadInput
from gpuprov.providers import DEFAULT_PROVIDER
from gpuprov.providers import names as provider_names
from gpuprov.sharing import choice as sharing_choice


class DriverType(click.types.StringParamType):
    """`--driver`: a branch (580) or a release (580.95.05), checked when the flag is read, so
    every command that takes it refuses the same value with the same line (validate.driver)."""

    name = "driver"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        return validate.driver(super().convert(value, param, ctx))


DRIVER = DriverType()


class PriceType(click.types.FloatParamType):
    """`--max-price`: US dollars per instance-hour, a finite number above 0 and at most
    defaults.MAX_PRICE_USD (nan and inf are floats to click; not budgets)."""

    name = "usd"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        usd = super().convert(value, param, ctx)
        if not (0 < usd <= defaults.MAX_PRICE_USD):  # also false for nan
            raise BadInput(f"--max-price {value}: expected US dollars per instance-hour, more than 0 "
                           f"and at most {defaults.MAX_PRICE_USD:,.0f}")
        return usd


PRICE = PriceType()


class GpuSharingType(click.types.StringParamType):
    """`--gpu-sharing`: mig:LAYOUT, mps, shard:N or none, its form checked when the flag is read
    (gpuprov.sharing.choice: one line, exit 2); the layout is checked against the GPU model by the
    lock's resolver, before anything is created."""

    name = "sharing"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = super().convert(value, param, ctx)
        if not text.strip():  # refused by name with every empty value (refuse_empty_values)
            return text
        return sharing_choice.parse(text).spelled() or "none"


GPU_SHARING = GpuSharingType()
GPU_SHARING_HELP = (f"How one GPU serves many jobs: mig:LAYOUT (a MIG layout of the GPU model, e.g. "
                    f"mig:all-1g.10gb, mig:all-balanced), mps, shard:N (Slurm shards per GPU, 2-"
                    f"{defaults.MAX_GPU_SHARDS}) or none. Recorded in the lock and applied on the nodes by the "
                    "gpu_sharing role (docs/gpu-sharing.md).")

# The parameter types whose value is not text as the user typed it; every other one (click's
# STRING, Path, Choice, DriverType, a type added later) is, and an empty one is never meant.
NOT_TEXT = (click.types.IntParamType, click.types.FloatParamType, click.types.BoolParamType,
            click.types.UnprocessedParamType)


def takes_text(param: click.Parameter) -> bool:
    """A flag or argument whose value is text (not a switch, a number or `exec`'s raw words)."""
    return not getattr(param, "is_flag", False) and not isinstance(param.type, NOT_TEXT)


def refuse_empty_values(group: click.Group) -> None:
    """Every text flag and argument of every command under ``group``, subcommands included,
    refuses an empty or all-whitespace value (BadInput: one line naming it, exit 2) as it is
    read: click would hand '' on as a value, and the commands take a false value for "not
    given". Run once, when the commands are registered (gpuprov.cli)."""
    for command in _commands(group):
        for param in command.params:
            if takes_text(param) and not getattr(param.callback, "refuses_empty", False):
                param.callback = _refusing_empty(param.callback)


def _commands(command: click.Command) -> list[click.Command]:
    found = [command]
    for sub in getattr(command, "commands", {}).values():
        found += _commands(sub)
    return found


def _refusing_empty(callback: Callable[..., Any] | None) -> Callable[..., Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        given = ctx.get_parameter_source(param.name or "") not in (click.core.ParameterSource.DEFAULT,
                                                                   click.core.ParameterSource.DEFAULT_MAP)
        for item in value if isinstance(value, tuple) else (value,):
            if given and isinstance(item, str) and not item.strip():
                name = flag_name(param)
                optional = isinstance(param, click.Option) and not param.required
                out = f", or leave {name} out" if optional else ""
                raise BadInput(f"{name} {item!r}: empty; give a value{out}")
        return value if callback is None else callback(ctx, param, value)

    check.refuses_empty = True  # type: ignore[attr-defined]
    return check


def flag_name(param: click.Parameter) -> str:
    """How the user names ``param``: its long flag (--output, not -o), or an argument's NAME."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def output_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--output",
        "-o",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Table for people, JSON (one document on stdout) for programs.",
    )(fn)


# Top to bottom as `gpuprov up --help` lists them.
UP_OPTIONS = [
    click.option("--name", help="Cluster name (generated and printed when absent)."),
    click.option(
        "--type",
        "instance_type",
        metavar="TYPE",
        help="Instance type, e.g. p4d.24xlarge (`gpuprov types` lists them). "
        "docker: docker-node (the default); static: optional, sets what probes expect.",
    ),
    click.option(
        "--count",
        type=click.IntRange(min=1, max=defaults.MAX_NODES),
        metavar="N",
        help="Number of nodes (static: defaults to every host in --hosts).",
    ),
    click.option(
        "--provider",
        type=click.Choice(provider_names()),
        default=DEFAULT_PROVIDER,
        show_default=True,
        help="Where the nodes come from.",
    ),
    click.option("--region", help="Cloud region (aws)."),
    click.option("--image", help="Machine image: an AMI id (aws; wins over --os) or a local image "
        "(docker). Default: the newest image baked for the cluster's version lock (`gpuprov image "
        "list`; aws: of this account and --os), else the node image (docker) or --os's image (aws)."),
    click.option("--no-baked", is_flag=True, help="aws, docker: boot from the default image and "
        "bootstrap from scratch, even when an image is baked for the lock."),
    click.option("--os", "os_name", type=click.Choice(defaults.UP_OS),
        help=f"The nodes' OS, whose packages the lock names (default: {defaults.DEFAULT_OS}). aws: the "
        "publisher's newest image of it; docker: its node image (debian12: gpuprov/node:bookworm, "
        "debian13: gpuprov/node:trixie); static: a claim, checked against each host's /etc/os-release. "
        "`gpuprov stack` says which are proven here."),
    click.option("--ssh-cidr", help="Source range allowed to SSH in (aws; default: your address/32; "
        "at most /16 for IPv4, /48 for IPv6)."),
    click.option("--allow-wide-ssh-cidr", is_flag=True,
        help="aws: accept an --ssh-cidr wider than /16 (IPv4) or /48 (IPv6); SSH is then open to "
        "that much of the internet."),
    click.option("--spot", is_flag=True, help="Use spot capacity (aws)."),
    click.option("--max-price", type=PRICE, metavar="USD", help="aws: launch the cheapest allowed type (--type, "
        "else every GPU type gpuprov knows) and region (--regions) that costs at most USD per instance-hour "
        "(on-demand; with --spot, spot) and has capacity, going on to the next-cheapest when no zone has it."),
    click.option("--regions", metavar="R1,R2", help="aws, with --max-price: the regions to choose from "
        "(default: --region's)."),
    click.option(
        "--disk-gb",
        type=click.IntRange(min=defaults.NODE_FREE_GIB, max=defaults.MAX_DISK_GB),
        metavar="GIB",
        help="Root volume size in GiB, encrypted gp3 (aws; default 200, room for CUDA; at least "
        f"{defaults.NODE_FREE_GIB + defaults.AWS_IMAGE_ROOT_GIB}: the {defaults.NODE_FREE_GIB} GiB free the "
        f"bootstrap needs beside the image's own {defaults.AWS_IMAGE_ROOT_GIB}; "
        f"{defaults.NODE_FREE_GIB} with --image).",
    ),
    click.option(
        "--capacity-reservation",
        metavar="ID",
        help="Launch into this EC2 capacity reservation (aws; cr-...).",
    ),
    click.option(
        "--rollback/--no-rollback",
        default=None,
        help="When nodes never answer SSH or the bootstrap fails, terminate what this run launched "
        "(default: on for a new aws cluster, off otherwise; with --min-count K: when fewer than K "
        "nodes converge).",
    ),
    click.option(
        "--hosts",
        "hosts_file",
        type=click.Path(dir_okay=False),
        help="Inventory of existing hosts, YAML or INI (static).",
    ),
    click.option(
        "--no-bootstrap",
        is_flag=True,
        help="Launch and wait until the nodes run; no SSH wait, no playbooks, no health checks, no probes.",
    ),
    click.option("--bootstrap", "bootstrap_mode", type=click.Choice(["auto", "push", "pull"]), default="auto",
        show_default=True, help="push: Ansible runs here, over SSH to every node. pull: each new node "
        "fetches a bundle served from here, or on aws from the cluster's S3 bucket (checked by its sha256), "
        "bootstraps and verifies itself, and reports back (docker, static and aws providers). auto: pull "
        "above 32 nodes where the provider has it, else push."),
    click.option("--min-count", type=click.IntRange(min=1, max=defaults.MAX_NODES), metavar="K",
        help="aws: accept a launch of at least K nodes when capacity runs short in every zone, and "
        "at least K nodes that pass the bootstrap and health gate: a node that fails them is named, "
        "terminated and replaced (default: all --count or nothing)."),
    click.option("--retries", type=click.IntRange(min=0, max=defaults.MAX_RETRIES), metavar="N",
        help="With --min-count: rounds of replacements for nodes that fail the bootstrap or health gate "
        "(default 1: one fresh node clears a bad host; a second failure points at the image or the "
        "plays, where more launches only cost more; 0: none)."),
    click.option("--keep-failed", is_flag=True,
        help="With --min-count: leave a failed node running for inspection instead of terminating it; "
        "it leaves the node list (`status` shows it as kept) and `down` removes it with the cluster."),
    click.option("--tags", metavar="T",
        help="Bootstrap with only these plays/roles (comma-separated Ansible tags, as `provision "
        "--tags`); the cluster is not marked bootstrapped, and `provision` completes it."),
    click.option("--health", default="quick", show_default=True, metavar="off|quick|standard",
        help="Health checks on the nodes once bootstrapped (as `gpuprov health`); exit 1 when one "
        "fails. standard adds DCGM's diagnostic and NCCL inside each node (minutes). None with --no-bootstrap."),
    click.option("--no-verify", is_flag=True, help="Skip the probes `up` runs once the nodes are "
        "bootstrapped and healthy (`gpuprov verify NAME` runs them later); the cluster stays bootstrapped."),
    click.option("--source", type=click.Choice(defaults.PACKAGE_SOURCES),
        help=f"Package source for the NVIDIA stack (default: {defaults.LOCAL_SOURCE} for docker, "
        f"else {defaults.DEFAULT_SOURCE})."),
    click.option("--driver", type=DRIVER, metavar="BRANCH",
                 help="Driver branch or release (default: the lock's)."),
    click.option("--kernel-module", type=click.Choice(defaults.KERNEL_MODULES),
        help="Kernel module flavour (default: from the GPUs: proprietary for V100, else open)."),
    click.option("--cuda", metavar="X.Y", help=f"CUDA line (default {defaults.DEFAULT_CUDA}, the one gpuprov "
                 "installs; `gpuprov stack --cuda 12.9|13.0` shows the others' locks)."),
    click.option("--gpu-sharing", type=GPU_SHARING, metavar="MODE", help=GPU_SHARING_HELP + " Default: none."),
    click.option("--mirror-url", metavar="URL", help="Internal mirror with NVIDIA's layout (--source mirror)."),
    click.option("--mirror-key-fingerprint", metavar="FPR", help="The mirror's signing key fingerprint."),
    click.option("--scheduler", type=click.Choice(defaults.SCHEDULERS), default=defaults.DEFAULT_SCHEDULER,
        show_default=True, help="slurm: Debian's Slurm on the nodes (one controller, every node a "
        "compute node, GPUs as GRES, the fabric's NCCL settings in every job)."),
    click.option("--slurm-controller", metavar="NODE", help="With --scheduler slurm: the controller "
        "(default: the first node)."),
    click.option("--slurm-controller-only", is_flag=True, help="With --scheduler slurm: the controller "
        "runs no jobs."),
    click.option("--max-count", type=click.IntRange(min=1, max=defaults.MAX_NODES), metavar="M",
        help="With --scheduler slurm: up to M nodes, --count of them static and the rest dynamic (powered up "
        "by Slurm when jobs need them, down when idle; docs/slurm.md)."),
    click.option("--idle-minutes", type=click.IntRange(min=1, max=defaults.MAX_IDLE_MINUTES), metavar="MIN",
        help="With --max-count: a dynamic node's idle minutes before it is powered down (default "
        f"{defaults.DEFAULT_IDLE_MINUTES})."),
    click.option("--replace-unhealthy", is_flag=True, help="With --max-count, local nodes: a static node drained by "
        "its own health is replaced, once its jobs end, by a fresh one from the cluster's image (docs/slurm.md)."),
    click.option("--no-accounting", is_flag=True, help="With --scheduler slurm: no Slurm accounting (by default "
        "slurmdbd with MariaDB on the controller records every job for `gpuprov usage`; docs/slurm.md)."),
    click.option("--slurm-dbd", metavar="NODE", help="With --scheduler slurm: the node slurmdbd and MariaDB run on "
        "(default: the controller)."),
    click.option("--dry-run", is_flag=True, help="Check and show the plan; create nothing."),
    click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
]


@dataclass(frozen=True)
class UpFlags:
    """`gpuprov up`'s flags as click gives them (UP_OPTIONS, the name and the output), typed, in one
    record: the command reads them from here, not from 38 parameters."""

    name: str | None
    instance_type: str | None
    count: int | None
    provider: str
    region: str | None
    image: str | None
    no_baked: bool
    os_name: str | None
    ssh_cidr: str | None
    allow_wide_ssh_cidr: bool
    spot: bool
    max_price: float | None
    regions: str | None
    disk_gb: int | None
    capacity_reservation: str | None
    rollback: bool | None
    hosts_file: str | None
    no_bootstrap: bool
    bootstrap_mode: str
    min_count: int | None
    retries: int | None
    keep_failed: bool
    tags: str | None
    health: str
    no_verify: bool
    source: str | None
    driver: str | None
    kernel_module: str | None
    cuda: str | None
    gpu_sharing: str | None
    mirror_url: str | None
    mirror_key_fingerprint: str | None
    scheduler: str
    slurm_controller: str | None
    slurm_controller_only: bool
    max_count: int | None
    idle_minutes: int | None
    replace_unhealthy: bool
    no_accounting: bool
    slurm_dbd: str | None
    dry_run: bool
    yes: bool
    output: str


def up_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(UP_OPTIONS):
        fn = option(fn)
    return fn


def debug_anywhere(args: list[str]) -> tuple[list[str], bool]:
    """``--debug`` before the command or after it (`gpuprov verify demo --debug`), never after a
    ``--`` (a command's own words, as `exec NAME -- prog --debug`): the arguments with it moved
    before the command, and whether it was given."""
    end = args.index("--") if "--" in args else len(args)
    head = [a for a in args[:end] if a != "--debug"]
    debug = len(head) < end
    return (["--debug", *head, *args[end:]] if debug else list(args)), debug
