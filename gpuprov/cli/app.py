"""The gpuprov command line: parse, call one core function, print.

Start-up stays fast: only click is imported here at module level; boto3,
Ansible, testinfra, fabric and rich load inside the commands that use them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import click

from gpuprov import __version__, defaults, state_choice
from gpuprov.cli import budget as cli_budget
from gpuprov.cli import local as cli_local
from gpuprov.cli import output as cli_output
from gpuprov.cli.health import health
from gpuprov.cli.image import image
from gpuprov.cli.local import verify_options
from gpuprov.cli.monitor import monitor
from gpuprov.cli.options import UpFlags, debug_anywhere, output_option, refuse_empty_values, up_options
from gpuprov.cli.patch import patch
from gpuprov.cli.registry import core
from gpuprov.cli.slurm import slurm
from gpuprov.cli.ssh import ssh_cmd, ssh_config_cmd
from gpuprov.cli.stack import cuda_for_install, stack, types
from gpuprov.cli.team import access, state, unlock
from gpuprov.cli.usage import usage_cmd
from gpuprov.console import Console
from gpuprov.errors import CHANGES_PENDING, BadInput, GpuprovError
from gpuprov.lock.stack_choice import StackChoice
from gpuprov.providers import ClusterSpec, options_for
from gpuprov.slurm.scheduler_choice import Replacement, Scheduler


def _console():
    return Console()


def _interactive() -> bool:
    return sys.stdin.isatty()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuprov")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def cli(debug: bool) -> None:
    """Launch GPU nodes, bootstrap the NVIDIA stack with Ansible, verify with probes.

    \b
    Local try-out (no GPU, no cost):
      gpuprov up --provider docker --count 2 --name demo
      gpuprov verify demo
      gpuprov down demo --yes

    State lives in GPUPROV_HOME (default: the user state directory). AWS
    credentials and endpoint come from boto3's standard chain.
    """
    # Checked before any command changes anything (the ansible.cfg it names is written later).
    if state_choice.chosen() is not None:  # the S3 state (docs/team-state.md): its backend, with boto3
        import gpuprov.state_s3  # noqa: F401  # lazy: CLI start-up
    strategy = os.environ.get("GPUPROV_ANSIBLE_STRATEGY")
    if strategy is not None and strategy not in ("linear", "mitogen"):
        raise BadInput(f"GPUPROV_ANSIBLE_STRATEGY={strategy!r}: expected linear (the default) or mitogen")


# -- up ------------------------------------------------------------------------------
@cli.command()
@up_options
@output_option
def up(**given: Any) -> int:
    """Launch a cluster and bootstrap it (idempotent: re-running completes a cluster)."""
    from gpuprov import cluster  # lazy: CLI start-up

    f = UpFlags(**given)
    flags = {"region": f.region, "image": f.image, "no_baked": f.no_baked, "os": f.os_name, "ssh_cidr": f.ssh_cidr,
             "allow_wide_ssh_cidr": f.allow_wide_ssh_cidr, "spot": f.spot, "disk_gb": f.disk_gb,
             "capacity_reservation": f.capacity_reservation, "hosts_file": f.hosts_file}
    # The provider's own flags first (a flag of another provider, --os on local nodes, is refused
    # naming it), then what the stack line asks of them.
    options_for(f.provider, flags)
    cuda = cuda_for_install(f.cuda, f.instance_type, f.source, os=f.os_name,
                            bootstrap=not (f.no_bootstrap or f.dry_run))
    if f.name is not None:
        cluster.validate_name(f.name)
    name = f.name or cluster.generate_name()

    def request_for(instance_type: str | None, region: str | None) -> Any:
        # The provider's own flags: its options type says which it takes (a flag of another
        # provider is refused, naming it); every other check is core's and the provider's.
        options = options_for(f.provider, {**flags, "region": region})
        spec = ClusterSpec(
            name=name, provider=f.provider, instance_type=instance_type, count=f.count,
            options=options, min_count=f.min_count, retries=f.retries, keep_failed=f.keep_failed,
            stack=StackChoice(cuda=cuda, driver=f.driver, source=f.source, kernel_module=f.kernel_module,
                              mirror_url=f.mirror_url, mirror_key_fingerprint=f.mirror_key_fingerprint,
                              gpu_sharing=f.gpu_sharing),
            scheduler=Scheduler(kind=f.scheduler, controller=f.slurm_controller,
                                controller_only=f.slurm_controller_only, max_count=f.max_count,
                                idle_minutes=f.idle_minutes, accounting=not f.no_accounting, dbd=f.slurm_dbd,
                                replace=Replacement(health=f.health) if f.replace_unhealthy else None),
        )
        return core("up").UpRequest(spec, bootstrap=not f.no_bootstrap, rollback=f.rollback, health=f.health,
                                   tags=f.tags, mode=f.bootstrap_mode, dry_run=f.dry_run,
                                   name_generated=f.name is None, verify=not f.no_verify)

    if f.max_price is None and f.regions is None:
        request = request_for(f.instance_type, f.region)
        result = core("up").up(request, console=_console(), confirm=_launch_confirmation(f.yes))
    else:
        request, result = cli_budget.up_within_budget(request_for, f.instance_type, f.region, f.regions,
                                                      f.max_price, f.spot, f.provider, _console(),
                                                      _launch_confirmation(f.yes))
    if not f.dry_run:  # once, for the lock the cluster now runs (before the last line, the verdict)
        cli_output.eol_warning_of(request.spec.name)
    cli_output.up_result(result, f.output)
    failed = [result.bootstrap and not result.bootstrap.ok, result.health and not result.health.ok,
              result.verdict and result.verdict.ready is False]
    return 1 if any(failed) else 0


def _launch_confirmation(yes: bool) -> Callable[[Any], bool]:
    """Ask before a launch that costs money (--yes: do not ask; no terminal: refuse)."""

    def confirm(plan: Any) -> bool:
        if yes:
            return True
        if not _interactive():
            raise BadInput("this launch costs money: pass --yes to confirm without a prompt")
        return click.confirm(f"Launch {plan.to_create} x {plan.spec.instance_type}?", default=False, err=True)

    return confirm


# -- down / list / status ----------------------------------------------------------------
@cli.command()
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--region", help="aws: where to look by tag when local state has lost the cluster.")
@click.option("--keep-accounting", is_flag=True, help="A Slurm cluster with accounting: first export every job's "
              "sacct line and a mysqldump of its accounting database into clusters/NAME/accounting-STAMP/ (kept); "
              "a failed export removes nothing.")
def down(name: str, yes: bool, region: str | None, keep_accounting: bool) -> int:
    """Remove a cluster's nodes (static: forget them; the machines are not touched).

    aws: terminates the instances, waits, then deletes the cluster's elastic
    IPs, placement group, security group and key pair, all found by the tag
    gpuprov:cluster=NAME (also when local state is gone)."""
    def confirm(question: str) -> bool:
        if yes:
            return True
        if not _interactive():
            raise BadInput(f"refusing to take '{name}' down without --yes (no terminal to ask)")
        return click.confirm(question, default=False, err=True)

    core("down").down(name, console=_console(), confirm=confirm, region=region, keep_accounting=keep_accounting)
    return 0


@cli.command(name="list")
@click.option("--region", help="aws: also look for tagged clusters in this region.")
@output_option
def list_(region: str | None, output: str) -> int:
    """List the clusters this state directory knows, reconciled with AWS tags.

    When AWS is set up here, clusters tagged gpuprov:cluster=NAME that no
    state knows show as `untracked (tags only)`, and recorded aws clusters
    whose instances are gone as `missing at aws`."""
    rows = core("list").list_clusters(region=region, console=_console())
    if output == "json":
        cli_output.emit_json(rows)
    else:
        cli_output.cluster_list(rows)
    return 0


@cli.command()
@click.argument("name")
@output_option
def status(name: str, output: str) -> int:
    """Show a cluster's nodes as the provider sees them now, and its recent runs."""
    data = core("status").status(name)
    if output == "json":
        cli_output.emit_json(data)
    else:
        cli_output.status(name, data)
    return 0


# -- provision / verify -----------------------------------------------------------------------
@cli.command()
@click.argument("name")
@click.option("--check", is_flag=True, help="Dry run (ansible --check --diff): change nothing; each node's drift "
              "from its manifest, item by item, and each task that would change. Exit 0: nothing to "
              "change; 3: changes pending; 1: a node failed.")
@click.option("--tags", metavar="T", help="Only these plays/roles (comma-separated Ansible tags).")
@click.option("--full", is_flag=True, help="Run the plays on every node, also where its manifest holds.")
@click.option("--via", type=click.Choice(["push", "pull"]), default="push", show_default=True,
              help="push: Ansible runs from here over SSH; pull: each node fetches the bundle and runs the "
              "plays itself (no Slurm; not with --check).")
@click.option("--scheduler", type=click.Choice(defaults.SCHEDULERS),
              help="Give the cluster this scheduler (recorded), then converge (slurm: `--tags slurm` "
              "runs only its play).")
@click.option("--slurm-controller", metavar="NODE",
              help="With --scheduler slurm: the controller (default: the first node).")
@click.option("--slurm-controller-only", is_flag=True, help="With --scheduler slurm: the controller runs no jobs.")
@click.option("--max-count", type=click.IntRange(min=1, max=defaults.MAX_NODES), metavar="M",
              help="A Slurm cluster of up to M nodes: its nodes static, the rest dynamic (docs/slurm.md).")
@click.option("--idle-minutes", type=click.IntRange(min=1, max=defaults.MAX_IDLE_MINUTES), metavar="MIN",
              help="With --max-count: a dynamic node's idle minutes before it is powered down "
              f"(default {defaults.DEFAULT_IDLE_MINUTES}).")
@click.option("--replace-unhealthy/--no-replace-unhealthy", default=None,
              help="With --max-count, local nodes: replace a static node drained by its own health, once its jobs "
              "end, with a fresh one from the cluster's image, converged with this run's --tags (recorded; "
              "docs/slurm.md).")
@click.option("--accounting/--no-accounting", default=None,
              help="Slurm's accounting on (slurmdbd with MariaDB on the controller, a Slurm cluster's default) or "
              "off; recorded (default: as recorded).")
@click.option("--slurm-dbd", metavar="NODE", help="With --scheduler slurm: the node slurmdbd and MariaDB run on "
              "(default: the controller; recorded, and not moved once the database is there).")
@output_option
def provision(name: str, check: bool, tags: str | None, full: bool, via: str, scheduler: str | None,
              slurm_controller: str | None, slurm_controller_only: bool, max_count: int | None,
              idle_minutes: int | None, replace_unhealthy: bool | None, accounting: bool | None,
              slurm_dbd: str | None, output: str) -> int:
    """Run the bootstrap playbooks (site.yml) on every node whose manifest does not hold; safe
    to re-run."""
    if scheduler is None and (slurm_controller or slurm_controller_only):
        raise BadInput("--slurm-controller and --slurm-controller-only go with --scheduler slurm")
    if scheduler is None and slurm_dbd:
        raise BadInput("--slurm-dbd goes with --scheduler slurm")
    if via == "pull" and (check or scheduler or accounting is not None):
        flag = "--check" if check else "--scheduler" if scheduler else "--accounting/--no-accounting"
        raise BadInput(f"--via pull cannot go with {flag}: "
                       + ("the nodes converge for real" if check else "pull never configures Slurm"))
    chosen = None if scheduler is None else Scheduler(kind=scheduler, controller=slurm_controller,
                                                      controller_only=slurm_controller_only, dbd=slurm_dbd)
    data = core("provision").provision(name, console=_console(), check=check, tags=tags,
                                       scheduler_choice=chosen, full=full, via=via,
                                       max_count=max_count, idle_minutes=idle_minutes, accounting=accounting,
                                       replace=Replacement() if replace_unhealthy else replace_unhealthy)
    if output == "json":
        cli_output.emit_json(data)
    else:
        cli_output.provision_table(name, data)
    if not check:
        cli_output.eol_warning_of(name)
    if not data.ok:
        return 1
    # --check: 0 nothing to change, CHANGES_PENDING something would change (docs/exit-codes.md)
    return CHANGES_PENDING if check and any(s.changed for s in data.hosts.values()) else 0


@cli.command()
@click.argument("name", required=False)
@click.option("--level", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
              help="quick: fast probes; full: also the slow ones.")
@verify_options
def verify(name: str | None, level: str, local: bool, output: str, **flags: Any) -> int:
    """Probe every node (testinfra) and report pass / fail / skip, each with its reason.

    With --local instead of NAME: this machine itself (no cluster, no SSH)."""
    name = cli_local.cluster_name(name, local, output, flags)
    if name is None:
        return cli_local.verify_local(level, output, **flags)
    data = core("verify").verify(name, console=_console(), level=level, only=flags.get("only"))
    if output == "json":
        cli_output.emit_json(data)
    else:
        cli_output.verify_table(name, data, every=flags["every"])
    return 0 if data.ok else 1


# -- exec / inventory / types ------------------------------------------------------------------
@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--node", "nodes", multiple=True, metavar="NODE", help="Only this node (repeatable).")
@click.option("--controller", is_flag=True, help="Only the Slurm controller (a Slurm cluster).")
def exec_(name: str, command: tuple[str, ...], nodes: tuple[str, ...], controller: bool) -> int:
    """Run a command on every node at once (or on the nodes named); output is prefixed by node.

    \b
    gpuprov exec demo -- uname -r
    gpuprov exec demo --controller -- sinfo
    """
    results = core("exec").run(name, list(command), console=_console(), names=nodes, on_controller=controller)
    return 0 if all(r.exit_code == 0 for r in results) else 1


@cli.command(name="settings")
@click.argument("name", required=False)
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
              help="Change one setting (KEY= removes it); repeatable.")
@click.option("--record", is_flag=True,
              help="Take every setting from the environment and the settings file as they are now.")
@output_option
def settings_cmd(name: str | None, assignments: tuple[str, ...], record: bool, output: str) -> int:
    """Show or change where a cluster's nodes get packages, artifacts and images.

    Recorded at `up` (the environment, else the settings file in the user config dir) and
    reused by every later command; the next `provision` or `patch` applies a change.

    
    Without NAME, `--set state=s3://BUCKET/PREFIX` (or `state=local`) chooses where this
    machine's cluster records are, and `--set identity=PATH` names your own private key, which
    gpuprov logs in to a cluster's nodes with where this machine does not hold the cluster's
    key (docs/team-state.md).
    """
    changes = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            raise BadInput(f"--set {item!r}: expected KEY=VALUE")
        changes[key] = value
    if name is None:
        if not changes or not set(changes) <= {"state", "identity"} or record:
            raise BadInput("gpuprov settings: give a cluster's NAME, or without one only "
                           "--set state=s3://BUCKET/PREFIX (or state=local) and --set identity=PATH")
        if "state" in changes:  # both checked before either is written: bad input changes nothing
            state_choice.parse(changes["state"], "--set state=")
        if "identity" in changes:
            core("settings --set").use_identity(changes["identity"], _console())
        if "state" in changes:
            core("settings --set").use(changes["state"], _console())
        return 0
    data = core("settings").change_settings(name, changes, record=record)
    if output == "json":
        cli_output.emit_json(data)
    else:
        cli_output.settings_table(data.settings)
        if data.changed:
            click.echo(f"changed: {', '.join(data.changed)}; `gpuprov provision {name}` applies them")
    return 0


@cli.command()
@click.argument("name")
@output_option
def inventory(name: str, output: str) -> int:
    """Print the cluster's Ansible inventory (YAML; JSON in ansible-inventory's form)."""
    text, data = core("inventory").inventory(name)
    if output == "json":
        cli_output.emit_json(data)
    else:
        click.echo(text, nl=False)
    return 0


@cli.command(name="power-service")
@click.argument("name")
def power_service(name: str) -> int:
    """Serve a cluster's dynamic Slurm nodes (local nodes): power them up and down as its
    controller asks, until stopped. `up`/`provision --max-count` start it detached and `down`
    stops it; run it yourself only under a service manager of your own (docs/slurm.md)."""
    return int(core("power-service").serve(name))


cli.add_command(types)
cli.add_command(health)
cli.add_command(stack)
cli.add_command(image)
cli.add_command(patch)
cli.add_command(monitor)
cli.add_command(ssh_cmd)
cli.add_command(ssh_config_cmd)
cli.add_command(usage_cmd)
cli.add_command(state)
cli.add_command(unlock)
cli.add_command(access)
cli.add_command(slurm)
refuse_empty_values(cli)


# -- entry point ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    args, debug = debug_anywhere(sys.argv[1:] if argv is None else argv)
    try:
        code = cli.main(args=args, prog_name="gpuprov", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("gpuprov: aborted", err=True)
        sys.exit(1)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)  # a UsageError's
        hint = (
            f" (see 'gpuprov {ctx.command_path.split(' ', 1)[1]} --help')"
            if ctx is not None and " " in ctx.command_path
            else ""
        )
        click.echo(f"gpuprov: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except GpuprovError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        click.echo(f"gpuprov: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("gpuprov: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if debug:
            raise
        click.echo(
            f"gpuprov: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
            err=True,
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
