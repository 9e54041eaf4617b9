"""`gpuprov verify`'s target: a cluster NAME, or `--local` (this machine, gpuprov.core.local)
with the flags only it takes, and its outputs (table, JSON, JUnit XML)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from gpuprov import defaults
from gpuprov.cli import output as cli_output
from gpuprov.cli.options import DRIVER
from gpuprov.cli.registry import core
from gpuprov.console import Console
from gpuprov.errors import BadInput

VERIFY_OPTIONS = [
    click.option("--local", is_flag=True, help="Probe this machine itself instead of a cluster: no "
                 "state, no SSH (testinfra's local connection; run as root for the whole check)."),
    click.option("--type", "local_type", metavar="TYPE", help="--local: the instance type this machine "
                 "is (`gpuprov types`): its GPU count and model, and the lock resolved for it."),
    click.option("--gpus", type=click.IntRange(min=0, max=defaults.MAX_NODE_GPUS), metavar="N",
                 help="--local, untyped: the NVIDIA GPUs this machine must show (0: none). Without --type "
                 "or --gpus the count is not checked."),
    click.option("--gpu-model", metavar="MODEL", help="--local, with --gpus: their model (H100, A100, ...)."),
    click.option("--driver", type=DRIVER, metavar="VERSION|BRANCH", help="--local: the driver release or "
                 "branch the lock pins (default: the lock's, as `gpuprov stack` resolves it)."),
    click.option("--cuda", metavar="LINE", help="--local: the CUDA line the lock pins (`gpuprov stack "
                 "--cuda`: 11.8, 12.9, 13.0; default: the lock's): what the CUDA, cuDNN and NCCL probes expect."),
    click.option("--only", metavar="GROUPS", help="Only these probe groups, a marker expression: gpu, "
                 "'gpu and not containers', 'driver or cuda' (the groups: gpuprov/probes/pytest.ini; a wrong one "
                 "lists them). A cluster: e.g. the groups of the plays `up --tags` ran."),
    click.option("--output", "-o", type=click.Choice(["table", "json", "junit"]), default="table",
                 show_default=True, help="Table for people, JSON (one document on stdout) for programs; "
                 "junit (--local): pytest's JUnit XML on stdout."),
    click.option("--all", "every", is_flag=True, help="Print every row, each skip too (default: the pass and "
                 "fail rows, one line per skip reason; JSON and JUnit hold every row)."),
]

# The flags of VERIFY_OPTIONS that only --local takes, as the user spells them.
LOCAL_FLAGS = {"local_type": "--type", "gpus": "--gpus", "gpu_model": "--gpu-model", "driver": "--driver",
               "cuda": "--cuda"}


def verify_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(VERIFY_OPTIONS):
        fn = option(fn)
    return fn


def cluster_name(name: str | None, local: bool, output: str, flags: dict[str, Any]) -> str | None:
    """The cluster to verify, or None for --local; BadInput where the two are mixed."""
    if name and local:
        raise BadInput(f"verify takes a cluster NAME or --local, not both ('{name}' and --local)")
    if not name and not local:
        raise BadInput("verify needs a cluster NAME, or --local to probe this machine")
    if local:
        return None
    given = [flag for key, flag in LOCAL_FLAGS.items() if flags.get(key) is not None]
    if output == "junit":
        given.append("-o junit")
    if given:
        raise BadInput(f"{', '.join(given)}: only with --local (a cluster's nodes are expected to be "
                       "what `up` recorded, with the cluster's lock)")
    return name


def verify_local(level: str, output: str, local_type: str | None, gpus: int | None,
                 gpu_model: str | None, driver: str | None, cuda: str | None, only: str | None,
                 every: bool = False) -> int:
    from gpuprov.probes import localhost  # lazy: CLI start-up

    req = localhost.request(instance_type=local_type, gpus=gpus, gpu_model=gpu_model, driver=driver, cuda=cuda,
                              only=only)
    data, junit = core("verify --local").verify_local(req, console=Console(), level=level)
    if output == "json":
        cli_output.emit_json(data)
    elif output == "junit":
        click.echo(junit, nl=not junit.endswith("\n"))
    else:
        cli_output.verify_table(localhost.LOCAL, data, every=every, again="gpuprov verify --local")
    return 0 if data.ok else 1
