"""Bad input that used to get through (issue 53, section 6): each is one line on stderr starting
`gpuprov:`, exit 2, refused as the command line is read, before anything is created or changed."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from gpuprov import defaults
from gpuprov.cli.app import cli
from tests.conftest import invoke

DRIVER_LINE = "gpuprov: --driver 'abc': expected a branch (580) or a release (580.95.05)"


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuprov: "), err
    return lines[0]


@pytest.mark.parametrize("args", [
    ["stack", "--type", "p4d.24xlarge"],
    ["up", "--provider", "docker", "--count", "1", "--dry-run"],
    ["patch", "demo", "--check"],
    ["verify", "--local", "--gpus", "0"],
])
def test_driver_is_checked_as_it_is_read(capsys, gpuprov_home: Path, args: list[str]) -> None:
    """`stack --driver abc` was an internal error (ValueError, exit 1) where `up` said exit 2:
    every command taking --driver now reads it with one type and answers with the same line."""
    line = _one_line(*invoke(capsys, *args, "--driver", "abc"))
    assert line == DRIVER_LINE
    assert not gpuprov_home.exists()


# -- every command, every text value ----------------------------------------------------------
# Values whose emptiness is documented as meaningful, each with its reason: none.
EMPTY_ALLOWED: dict[tuple[str, str], str] = {}
NOT_TEXT = (click.types.IntParamType, click.types.FloatParamType, click.types.BoolParamType,
            click.types.UnprocessedParamType)


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)] if path else []
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _commands(sub, (*path, name))
    return found


def _text_params() -> list[tuple[tuple[str, ...], click.Parameter]]:
    """Every flag and argument whose value is text (click.STRING, Path, Choice, any type but
    numbers, switches and `exec`'s raw words), of every command and subcommand."""
    return [(path, param) for path, command in _commands(cli) for param in command.params
            if not getattr(param, "is_flag", False) and not isinstance(param.type, NOT_TEXT)
            and not isinstance(command, click.Group)]


def _args_for(path: tuple[str, ...], tested: click.Parameter, value: str) -> list[str]:
    """The command line that gives ``tested`` the value, first, and every argument a value."""
    command = cli
    for name in path:
        command = command.commands[name]
    args = list(path) + ([max(tested.opts, key=len), value] if isinstance(tested, click.Option) else [])
    for param in command.params:
        if isinstance(param, click.Argument):
            args.append(value if param is tested else ("true" if param.nargs == -1 else "demo"))
    return args


TEXT_PARAMS = _text_params()


def test_the_walk_finds_the_text_values() -> None:
    names = {(" ".join(path), param.name) for path, param in TEXT_PARAMS}
    assert {("stack", "instance_type"), ("types", "gpu"), ("up", "cuda"), ("up", "region"),
            ("image bake", "region"), ("up", "hosts_file"), ("status", "name")} <= names
    assert len(TEXT_PARAMS) > 80


@pytest.mark.parametrize("value", ["", " \t"])
@pytest.mark.parametrize(("path", "param"), TEXT_PARAMS,
                         ids=[f"{' '.join(p)}:{q.name}" for p, q in TEXT_PARAMS])
def test_an_empty_value_is_bad_input_everywhere(capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                path: tuple[str, ...], param: click.Parameter, value: str) -> None:
    """`stack --type ''` printed a lock for no type; `--cuda ''`, `--gpu ''`, `--region ''` were
    taken as not given. Refused as the command line is read: no command body runs (each one here
    fails the test if it does), so no AWS, Docker or SSH, and no state directory is made."""
    if (" ".join(path), param.name) in EMPTY_ALLOWED:
        pytest.skip(EMPTY_ALLOWED[(" ".join(path), param.name)])

    def ran(*_: object, **__: object) -> None:
        raise AssertionError(f"gpuprov {' '.join(path)} ran with {param.name}={value!r}")

    for _, command in _commands(cli):
        if not isinstance(command, click.Group):  # a group's own callback runs before its commands parse
            monkeypatch.setattr(command, "callback", ran)
    line = _one_line(*invoke(capsys, *_args_for(path, param, value)))
    named = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
    assert named in line, line
    assert not gpuprov_home.exists()


# -- every whole number has bounds ---------------------------------------------------------------------
def _number_params() -> list[tuple[tuple[str, ...], click.Parameter]]:
    return [(path, param) for path, command in _commands(cli) for param in command.params
            if isinstance(param.type, click.types.IntParamType) and not getattr(param, "is_flag", False) and not getattr(param, "count", False)]


NUMBER_PARAMS = _number_params()


def test_the_walk_finds_the_numbers() -> None:
    names = {(" ".join(path), param.name) for path, param in NUMBER_PARAMS}
    assert {("up", "count"), ("up", "disk_gb"), ("patch", "batch"), ("patch", "grace"), ("types", "gpus"),
            ("verify", "gpus"), ("health", "gpus")} <= names


@pytest.mark.parametrize(("path", "param"), NUMBER_PARAMS, ids=[f"{' '.join(p)}:{q.name}" for p, q in NUMBER_PARAMS])
def test_every_number_has_bounds_shown_in_help(capsys, path: tuple[str, ...], param: click.Parameter) -> None:
    """Counts, batches, retries, timeouts and sizes: a lower and an upper bound, read with the
    flag (`patch --batch 99999999999999999999` was taken), and written in `--help`."""
    kind = param.type
    assert isinstance(kind, click.IntRange), (path, param.name, kind)
    assert kind.min is not None and kind.max is not None, (path, param.name, kind)
    code, out, _ = invoke(capsys, *path, "--help")
    assert code == 0 and kind._describe_range() in " ".join(out.split()), (param.name, kind._describe_range())


def test_a_batch_past_its_bound_is_refused(capsys, gpuprov_home: Path) -> None:
    line = _one_line(*invoke(capsys, "patch", "demo", "--microcode", "--batch", "99999999999999999999", "--check"))
    assert "--batch" in line and f"1<=x<={defaults.MAX_NODES}" in line
    assert not gpuprov_home.exists()


def test_disk_gb_help_and_refusal_agree(capsys, gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up --help` said [8<=x<=16384] and "at least 48", and 20 was refused asking for 48. The
    48 is the preflight's 40 GiB free beside the image's own 8 (40 with --image): the flag's
    range is the 40 no launch goes below, the help says both, and the refusals name the same."""
    least = defaults.NODE_FREE_GIB + defaults.AWS_IMAGE_ROOT_GIB
    code, out, _ = invoke(capsys, "up", "--help")
    text = " ".join(out.split())
    assert code == 0 and f"[{defaults.NODE_FREE_GIB}<=x<={defaults.MAX_DISK_GB}]" in text
    assert f"at least {least}" in text and f"{defaults.NODE_FREE_GIB} with --image" in text
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing may reach it
    base = ["up", "--provider", "aws", "--type", "p4d.24xlarge", "--count", "1", "--dry-run", "--yes"]
    line = _one_line(*invoke(capsys, *base, "--disk-gb", "20"))
    assert f"{defaults.NODE_FREE_GIB}<=x<={defaults.MAX_DISK_GB}" in line
    assert not gpuprov_home.exists()  # refused as the flag is read
    line = _one_line(*invoke(capsys, *base, "--disk-gb", str(least - 4)))  # refused by the preflight
    assert f"give --disk-gb {least} or more" in line


# -- static hosts files --------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "needles"), [
    # gpuprov's format with hosts: written as a mapping: Ansible took it as a group and warned
    # "Skipping key (gpu1) ... _AnsibleTaggedStr", then "lists no hosts".
    ("hosts:\n  gpu1: 10.0.0.1\n", ["host gpu1", "hosts: is a mapping, not a list"]),
    ("user: root\nhosts:\n  gpu1:\n    address: 10.0.0.1\n", ["host gpu1", "hosts: is a mapping"]),
    ("hosts:\n  name: gpu1\n  address: 10.0.0.1\n  user: root\n", ["host gpu1", "- name: gpu1"]),
    # An Ansible inventory with a key its yaml plugin skips, or a host's variables that are no mapping.
    ("all:\n  gpu1:\n    ansible_host: 10.0.0.1\n", ["group all", "unknown key gpu1"]),
    ("all:\n  hosts:\n    gpu1: 10.0.0.1\n", ["host gpu1", "expected a mapping of its variables"]),
    ("all:\n  hosts: [gpu1, gpu2]\n", ["group all", "hosts: expected a mapping, not a list"]),
    # An instance type the catalog does not know: it named neither the file nor the host.
    ("user: root\nhosts:\n  - name: gpu1\n    address: 10.0.0.1\n    instance_type: p9.huge\n",
     ["host gpu1", "instance_type: unknown instance type 'p9.huge'"]),
])
def test_a_hosts_file_ansible_would_skip_part_of_is_refused(capsys, gpuprov_home: Path, tmp_path: Path,
                                                             text: str, needles: list[str]) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text(text)
    line = _one_line(*invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts), "--dry-run"))
    assert f"hosts file {hosts}:" in line and "Tagged" not in line, line
    for needle in needles:
        assert needle in line, line
    assert not gpuprov_home.exists() or not any(gpuprov_home.iterdir())  # (reading the catalog makes it)


def test_an_ini_hosts_file_names_the_host_of_an_unknown_type(capsys, gpuprov_home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.ini"
    hosts.write_text("[gpu]\ngpu1 ansible_host=10.0.0.1 ansible_user=root gpuprov_instance_type=p9.huge\n")
    line = _one_line(*invoke(capsys, "up", "--provider", "static", "--hosts", str(hosts), "--dry-run"))
    assert f"hosts file {hosts}: host gpu1: gpuprov_instance_type: unknown instance type 'p9.huge'" in line


def test_an_ansible_group_named_hosts_is_still_a_group(tmp_path: Path) -> None:
    from gpuprov.providers import static

    hosts = tmp_path / "hosts.yml"
    hosts.write_text("hosts:\n  vars:\n    ansible_user: root\n  hosts:\n    gpu1:\n      ansible_host: 10.0.0.1\n")
    found, _ = static.parse_hosts_file(str(hosts))
    assert [(h.name, h.address, h.user) for h in found] == [("gpu1", "10.0.0.1", "root")]


@pytest.mark.parametrize("value", ["inf", "nan", "-3", "0", "1e6"])
@pytest.mark.parametrize("command", [["up", "--type", "p4d.24xlarge", "--yes"], ["types"]])
def test_max_price_is_a_finite_budget_as_it_is_read(capsys, gpuprov_home: Path, command: list[str],
                                                    value: str) -> None:
    """`up --max-price inf` went through as no budget at all (every type at most inf dollars),
    and the bound was `up`'s alone: both commands now read one type, bounded by
    defaults.MAX_PRICE_USD."""
    line = _one_line(*invoke(capsys, *command, "--max-price", value))
    assert line == (f"gpuprov: --max-price {value}: expected US dollars per instance-hour, more than 0 "
                    f"and at most {defaults.MAX_PRICE_USD:,.0f}")
    assert not gpuprov_home.exists()
