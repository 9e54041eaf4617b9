"""The docs and the CLI agree (issue 53, section 7): every `gpuprov ...` example in the README and
docs/ names a command that exists and options that command takes; the synopsis of docs/cli.md
lists exactly each command's options; every command's `--help` runs; and the examples that need
no cloud, no cluster and no GPU (`stack`, `types` from the bundled prices, `up --dry-run` on AWS
without credentials, `list` of an empty state) run as written: exit 0, or, where the doc shows the
refusal on the line after the example, exit 2 with that line.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import click
import pytest

from gpuprov.cli.app import cli
from tests.conftest import invoke

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GLOBAL = {"--debug", "--version", "--help", "-h"}
# Words that stand for a value the reader fills in, or prose after a command's name.
PLACEHOLDER = re.compile(r"[A-Z]{2,}|\.\.\.|[<>\[\]|$~]")


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], click.Command]:
    found: dict[tuple[str, ...], click.Command] = {}
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            found |= _commands(cmd, (*prefix, name))
        else:
            found[(*prefix, name)] = cmd
    return found


COMMANDS = _commands(cli)


def _options(cmd: click.Command) -> set[str]:
    return {o for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def _examples() -> list[tuple[str, str, bool]]:
    """(doc, the command line, whether it is a block of its own: fenced or indented code) for each
    `gpuprov ...` the docs show; a line continued with a backslash is joined."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        fenced, pending = False, ""
        for line in text.splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            stripped = pending + line.strip()
            joined, pending = bool(pending), ""
            if (fenced or line.startswith("    ") or joined) and stripped.startswith("gpuprov "):
                if stripped.endswith("\\"):
                    pending = stripped[:-1] + " "
                    continue
                found.append((doc.name, stripped, True))
        found += [(doc.name, m.group(1), False) for m in re.finditer(r"`(gpuprov [^`]+)`", text)]
    return found


def _shown_errors() -> dict[str, str]:
    """Block examples the docs show refused: the command line, and the `gpuprov: ...` line the
    doc gives on the line after it (`(...)`: the rest of the line, left out)."""
    shown = {}
    for doc in DOCS:
        lines = [ln.strip() for ln in doc.read_text().splitlines()]
        for line, after in itertools.pairwise(lines):
            if line.startswith("gpuprov ") and after.startswith("gpuprov: "):
                shown[" ".join(shlex.quote(w) for w in _words(line))] = after
    return shown


def _words(line: str) -> list[str]:
    """The command's own words: the shell's comment, redirection and pipe dropped, and what
    follows `--` (a remote command's words)."""
    line = re.split(r"\s+#\s", line)[0]
    try:
        words = shlex.split(line)
    except ValueError:  # an unclosed quote in prose: the words as written
        words = line.split()
    words = words[1:]
    for stop in ("--", ">", ">>", "|", "2>&1"):
        if stop in words:
            words = words[:words.index(stop)]
    return words


def _resolve(words: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    """The command path of an example and the words after it; None where the words after
    `gpuprov` are prose or a program's output (`gpuprov health: ...`)."""
    words = [w for w in words if w not in GLOBAL]
    if not words:
        return (), []
    for size in (3, 2, 1):  # `gpuprov slurm account add`: a group's group
        if tuple(words[:size]) in COMMANDS:
            return tuple(words[:size]), words[size:]
    return None


EXAMPLES = _examples()


def test_the_docs_show_examples_of_every_command() -> None:
    shown = {_resolve(_words(line)) and _resolve(_words(line))[0] for _, line, _ in EXAMPLES}
    assert set(COMMANDS) - shown == set(), "commands no doc shows"


@pytest.mark.parametrize(("doc", "line"), [(d, ln) for d, ln, _ in EXAMPLES], ids=lambda v: v[:60])
def test_every_example_names_a_command_and_options_it_takes(doc: str, line: str) -> None:
    words = [w for w in _words(line) if w not in GLOBAL]
    resolved = _resolve(words)
    if resolved is None:
        first = words[0]
        group = cli.commands.get(first)
        if isinstance(group, click.Group):  # `gpuprov image`, `gpuprov image bake|list|delete`
            for sub in words[1].split("|") if len(words) > 1 else ():
                assert sub in group.commands, f"{doc}: `{line}`: {first} has no {sub}"
            return
        # A word the reader fills in (`gpuprov --debug COMMAND`), or output quoted in the docs
        # (`gpuprov health: docker_active: ...`, the Slurm reason a node gives).
        assert PLACEHOLDER.search(first) or first.endswith(":"), f"{doc}: `{line}`: no such command"
        return
    path, rest = resolved
    if not path:
        return
    takes = _options(COMMANDS[path]) | GLOBAL
    for word in rest:
        for option in word.strip("[]").split("|"):
            option = option.split("=", 1)[0].strip("[]")
            if re.fullmatch(r"--?[a-z][\w-]*", option):
                assert option in takes, f"{doc}: `{line}`: {' '.join(path)} has no {option}"


def _synopsis() -> dict[tuple[str, ...], set[str]]:
    """docs/cli.md's synopsis: each command's options, over its lines (verify and health have a
    line for --local; image bake one for --from)."""
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text[text.index("    gpuprov up ["):text.index("- Data commands")]
    entries: list[str] = []
    for line in block.splitlines():
        if line.startswith("    gpuprov "):
            entries.append(line.strip())
        elif line.strip():
            entries[-1] += " " + line.strip()
    found: dict[tuple[str, ...], set[str]] = {}
    for entry in entries:
        resolved = _resolve(entry.split()[1:])
        assert resolved, entry
        found.setdefault(resolved[0], set()).update(re.findall(r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b", entry))
    return found


def test_the_synopsis_lists_exactly_each_commands_options() -> None:
    """Every command in docs/cli.md's synopsis, with every option it has (`--output`, which every
    data command takes, is said once under it), and none it does not."""
    synopsis = _synopsis()
    assert set(synopsis) == set(COMMANDS)
    assert "`--output table|json`" in (ROOT / "docs" / "cli.md").read_text()
    for path, documented in synopsis.items():
        have = {o for o in _options(COMMANDS[path]) if o.startswith("--")} - {"--help", "--output"}
        assert (sorted(have - documented), sorted(documented - have - {"-o"})) == ([], []), " ".join(path)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_help_runs(capsys, path: tuple[str, ...]) -> None:
    code, out, err = invoke(capsys, *path, "--help")
    assert code == 0 and out.startswith("Usage: gpuprov " + " ".join(path)) and err == "", err


def _runnable() -> list[str]:
    """The block examples that need no cloud, no cluster and no GPU, as written."""
    chosen = []
    for _, line, block in EXAMPLES:
        words = _words(line)
        resolved = _resolve(words)
        if not block or resolved is None or any(PLACEHOLDER.search(w) for w in words) or "--refresh" in words:
            continue
        path = resolved[0]
        if path in {("stack",), ("types",), ("list",)} or (path == ("up",) and "--dry-run" in words
                                                            and "--provider" not in words):
            chosen.append(" ".join(shlex.quote(w) for w in words))
    return sorted(set(chosen))


RUNNABLE = _runnable()
SHOWN_ERRORS = _shown_errors()


def test_the_runnable_examples_are_the_docs_own() -> None:
    """The README's budget command and the AWS plan are among them (so the selection is not empty)."""
    assert "types --for training --max-price 40" in RUNNABLE
    assert "up --type p4d.24xlarge --count 4 --dry-run" in RUNNABLE


@pytest.mark.parametrize("line", RUNNABLE)
def test_an_example_that_needs_no_cloud_runs_as_written(capsys, gpuprov_home, monkeypatch, tmp_path, line) -> None:
    """Without AWS credentials or endpoint: `types` and `stack` answer from what gpuprov carries,
    `up --dry-run` plans from the bundled prices and says what it could not check."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, out, err = invoke(capsys, *shlex.split(line))
    refused = SHOWN_ERRORS.get(line)
    if refused is not None:  # the doc shows it refused: exit 2, and the line it gives
        pattern = re.escape(refused).replace(re.escape("(...)"), ".*")
        assert code == 2 and out == "" and re.fullmatch(pattern, err.strip()), f"gpuprov {line}: {err}"
        return
    assert code == 0, f"gpuprov {line}: exit {code}\n{out[-2000:]}\n{err[-2000:]}"
    assert out.strip() or err.strip()
