"""Run a playbook with ansible-runner; stream its events into per-node progress.

Trust: the environment ansible-playbook gets is built here from an allow-list,
not copied from the controller (ansible-runner would copy the whole of it into
each run's artifacts, and it would set ANSIBLE_HOST_KEY_CHECKING=False, which
beats ansible.cfg and puts ``-o StrictHostKeyChecking=no`` first on every ssh
command line). Arguments reach ansible-playbook as a list, never re-split from
a string a user typed.

Extra variables are data, never templates: ansible-core loads ``-e @file`` as trusted
template source (so ``{{ lookup('pipe', ...) }}`` in any value would run), and ansible-runner
hands its ``extravars`` over that way. So they are written here as YAML in which every string,
key or value, carries Ansible's ``!unsafe`` tag (extravars_yaml), and passed with ``-e @file``;
ansible-runner gets none.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from gpuprov import paths, validate
from gpuprov.ansible.progress import PlaybookProgress
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles

# What ansible-playbook may inherit from the controller's environment: what a
# process needs to run (locale, home, temp) and the ssh agent for static hosts
# whose key lives there. Credentials of any kind are not on it.
ENV_ALLOW = ("HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES",
             "TZ", "TMPDIR", "SSH_AUTH_SOCK", "GPUPROV_HOME")
# gpuprov's own settings (mirrors, repositories) are not on it either: they reach the plays
# as the cluster's recorded values (gpuprov.settings), never from the caller's shell.
# Always set, whatever the controller's environment says.
ENV_FORCED = {
    "ANSIBLE_HOST_KEY_CHECKING": "True",
    "ANSIBLE_NOCOLOR": "1",
    "ANSIBLE_FORCE_COLOR": "0",
}


EXTRAVARS_FILE = "extravars.yml"


def extravars_yaml(data: Mapping[str, Any]) -> str:
    """``data`` as YAML that ansible-core reads back as the same values, every string (a
    mapping's keys too) tagged ``!unsafe``: Ansible never evaluates one as a template, whatever
    it holds. Booleans, numbers and null stay themselves; any other type is refused (a
    value's ``str()`` would be a guess)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def unsafe(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        # Double-quoted: every character, newlines and non-ASCII included, escaped and exact.
        return dumper.represent_scalar("!unsafe", str(value), style='"')

    def refuse(dumper: yaml.SafeDumper, value: Any) -> yaml.Node:
        raise GpuprovError(f"internal: a play variable of type {type(value).__name__} ({value!r})")

    # Exact types first (str's own representer would otherwise win), then subclasses by MRO.
    Dumper.add_representer(str, unsafe)
    Dumper.add_multi_representer(str, unsafe)
    Dumper.add_representer(tuple, Dumper.represent_list)
    Dumper.add_multi_representer(dict, Dumper.represent_dict)
    Dumper.add_multi_representer(list, Dumper.represent_list)
    Dumper.add_multi_representer(object, refuse)
    # No anchors or aliases: each value written out where it is.
    Dumper.ignore_aliases = lambda self, data: True
    return yaml.dump(dict(data), Dumper=Dumper, default_flow_style=False, sort_keys=True,
                     width=1 << 16, allow_unicode=False, explicit_start=True)


def write_extravars(path: Path, data: Mapping[str, Any]) -> Path:
    """:func:`extravars_yaml` of ``data`` in a new file only its owner reads (0600)."""
    text = extravars_yaml(data)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


@dataclass(frozen=True)
class PlaybookResult:
    ok: bool
    rc: int
    status: str
    hosts: dict[str, dict[str, int]]
    errors: dict[str, str]
    artifact_dir: Path
    # Per node, what each task that ran there ok worked on (gpuprov.ansible.progress.kept_result).
    results: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # A check run: per node, the name of each task that would change: those check mode reported
    # changed, then the commands it skipped that would run (counted in the node's "changed").
    would_change: dict[str, list[str]] = field(default_factory=dict)


def new_run_dir(files: ClusterFiles, kind: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = files.runs / f"{stamp}-{kind}"
    path.mkdir(parents=True, mode=0o700)
    return path


@cache
def known_tags() -> frozenset[str]:
    """The tags the playbooks and roles define (``never`` and ``always`` are not selectable)."""
    import yaml

    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            tags = node.get("tags")
            if isinstance(tags, str):
                found.update(t.strip() for t in tags.split(","))
            elif isinstance(tags, list):
                found.update(str(t) for t in tags)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    files = [*paths.playbooks_dir().glob("*.yml"), *paths.roles_dir().glob("*/tasks/*.yml"),
             *paths.roles_dir().glob("*/handlers/*.yml")]
    for file in files:
        walk(yaml.safe_load(file.read_text()))
    return frozenset(t for t in found if validate.TAG.fullmatch(t)) - {"never", "always"}


def _tag_list(node: dict[str, Any]) -> set[str]:
    tags = node.get("tags")
    if isinstance(tags, str):
        return {t.strip() for t in tags.split(",")}
    if isinstance(tags, list):
        return {str(t) for t in tags}
    return set()


@cache
def _site_plays() -> tuple[tuple[str, frozenset[str]], ...]:
    """site.yml's plays in its order: (the imported playbook's file name, its plays' own tags)."""
    import yaml

    out = []
    for entry in yaml.safe_load((paths.playbooks_dir() / "site.yml").read_text()):
        name = entry["ansible.builtin.import_playbook"]
        plays = yaml.safe_load((paths.playbooks_dir() / name).read_text())
        out.append((name, frozenset(t for play in plays for t in _tag_list(play))))
    return tuple(out)


@cache
def _tags_below_plays() -> frozenset[str]:
    """The tags set anywhere but on a play itself: the roles' tasks and handlers, the plays'
    own tasks and role entries (``always`` among them)."""
    import yaml

    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.update(_tag_list(node))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for file in [*paths.roles_dir().glob("*/tasks/*.yml"), *paths.roles_dir().glob("*/handlers/*.yml")]:
        walk(yaml.safe_load(file.read_text()))
    for name, _ in _site_plays():
        for play in yaml.safe_load((paths.playbooks_dir() / name).read_text()):
            walk([value for key, value in play.items() if key != "tags"])
    return frozenset(found)


def site_plays_for(playbook: Path, tags: Sequence[str]) -> list[Path] | None:
    """The playbooks of site.yml whose plays carry one of ``tags``, in site.yml's order: what a
    run of site.yml with ``--tags`` runs, without the other plays. ansible-playbook parses every
    play it is given, and runs each role's argument validation and base facts (tagged
    ``always``) in every play, asked for or not: three CPU-seconds a run and one more per node
    for nothing (docs/performance-history.md, 2026-12-07 (5)). None where that would not be the
    same run: another playbook, no tags, or a tag that is set below a play too."""
    if playbook.resolve() != (paths.playbooks_dir() / "site.yml").resolve() or not tags:
        return None
    asked = set(tags)
    if asked & _tags_below_plays():
        return None
    chosen = [name for name, play_tags in _site_plays() if play_tags & asked]
    covered = set().union(*(play_tags for _, play_tags in _site_plays() if play_tags & asked))
    if not chosen or not asked <= covered:
        return None
    return [paths.playbooks_dir() / name for name in chosen]


def parse_tags(tags: str | None) -> list[str]:
    """``--tags a,b`` as a list of tags the playbooks define; BadInput otherwise."""
    if tags is None:
        return []
    names = [t.strip() for t in tags.split(",")]
    known = known_tags()
    bad = [t for t in names if t not in known]
    if bad or not names:
        raise BadInput(f"--tags {tags!r}: unknown tag(s) {', '.join(repr(t) for t in bad) or '(none)'}; "
                       f"known: {', '.join(sorted(known))}")
    return names


def runner_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The whole environment ansible-playbook runs with."""
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    if bindir not in path.split(os.pathsep):
        path = bindir + os.pathsep + path
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env["PATH"] = path
    env.update(extra)
    env.update(ENV_FORCED)
    return env


def _would_change(would_file: Path, hosts_summary: dict[str, dict[str, int]],
                  changed_tasks: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """A check run's plan: each task that would change, by name, per node: those check mode
    reported changed, and the commands it skipped that would run (counted as changes too, in
    ``hosts_summary``: Ansible counts them skipped)."""
    commands = read_would_change(would_file, hosts_summary)
    would_change: dict[str, list[str]] = {}
    for host in hosts_summary:
        hosts_summary[host]["changed"] += len(commands.get(host, []))
        named = changed_tasks.get(host, []) + commands.get(host, [])
        if named:
            would_change[host] = named
    return would_change


def _cmdline(check: bool, tags: Sequence[str], limit: Sequence[str]) -> list[str]:
    args: list[str] = []
    if check:
        args += ["--check", "--diff"]
    if tags:
        args += ["--tags", ",".join(tags)]
    if limit:
        args += ["--limit", ",".join(limit)]
    return args


def _playbooks(playbook: Path, tags: Sequence[str], files: ClusterFiles) -> tuple[list[str], Path, str | None]:
    """(the arguments to add, the playbook and the inventory to hand ansible-runner). site.yml
    with --tags: only the plays asked for, each playbook on the command line (one
    ansible-playbook run, facts kept from play to play as in site.yml). ansible-playbook takes
    them as its last arguments, after the inventory: ansible-runner puts its own inventory
    argument before the playbook, so the inventory is given here."""
    plays = site_plays_for(playbook, tags)
    if not plays:
        return [], playbook, str(files.inventory)
    return ["-i", str(files.inventory), *map(str, plays[:-1])], plays[-1], None


def run_playbook(
    playbook: Path,
    files: ClusterFiles,
    hosts: Sequence[str],
    run_dir: Path,
    *,
    title: str,
    check: bool = False,
    tags: Sequence[str] = (),
    limit: Sequence[str] = (),
    extravars: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
    console: Any | None = None,
) -> PlaybookResult:
    """Run ``playbook``; ``secrets`` maps a play variable to a secret value that the
    play reads as a file (``lookup('file', var)``): the file lives on a memory file
    system for the length of the run, so the secret is never written to disk or to
    the run's artifacts."""
    import ansible_runner

    args = _cmdline(check, tags, limit)
    base_env = {"ANSIBLE_CONFIG": str(files.ansible_cfg)}
    would_file = run_dir / WOULD_CHANGE_FILE
    if check:
        base_env[WOULD_CHANGE_ENV] = str(would_file)
    progress = PlaybookProgress(hosts, title, console=console)
    with progress, SecretFiles(secrets or {}) as secret_files:
        # Every value as data (extravars_yaml); the secrets' file paths too. ansible-runner is
        # given no extravars: its own file would be read as trusted template source.
        variables = {**(extravars or {}), **secret_files}
        if variables:
            vars_file = write_extravars(run_dir / EXTRAVARS_FILE, variables)
            args += ["-e", f"@{vars_file}"]
        more, book, inventory = _playbooks(playbook, tags, files)
        runner = ansible_runner.interface.init_runner(
            private_data_dir=str(run_dir),
            playbook=str(book),
            inventory=inventory,
            envvars=base_env,
            # A list joined with shlex.join comes back from ansible-runner's
            # shlex.split as exactly the same list: no argument is re-split.
            cmdline=shlex.join(args + more) if args + more else None,
            event_handler=progress.handle,
            quiet=True,
            ident="ansible",
        )
        # ansible-runner seeded its environment with the controller's whole
        # environment and turned host key checking off; replace it, before it
        # is written to the artifacts or given to ansible-playbook.
        runner_added = {k: v for k, v in runner.config.env.items()
                        if k.startswith(("ANSIBLE_", "RUNNER_", "AWX_")) and os.environ.get(k) != v}
        runner.config.env = runner_env({**runner_added, **base_env})
        runner.run()
        result = runner
    artifact_dir = run_dir / "artifacts" / "ansible"
    if progress.stats is None and result.status != "successful":
        tail = _stdout_tail(artifact_dir)
        raise GpuprovError(
            f"ansible-playbook did not run ({result.status}, rc={result.rc}): {tail}"
            f" (full log: {artifact_dir / 'stdout'})"
        )
    hosts_summary = progress.summary()
    would_change = _would_change(would_file, hosts_summary, progress.changed_tasks) if check else {}
    errors = progress.errors()
    for host, counts in hosts_summary.items():
        if counts["tasks"] == 0 and not counts["failed"] and not counts["unreachable"]:
            # A play that ran nothing on a node proved nothing about it.
            errors.setdefault(host, "no task ran on this node")
    ok = result.rc == 0 and all(
        h["failed"] == 0 and h["unreachable"] == 0 and h["tasks"] > 0 for h in hosts_summary.values()
    )
    return PlaybookResult(ok=ok, rc=int(result.rc), status=str(result.status), hosts=hosts_summary, errors=errors,
                          artifact_dir=artifact_dir, results=progress.results, would_change=would_change)


# The check-mode callback's output (playbooks/callback_plugins/gpuprov_check.py): one JSON
# object per line, {"host", "task"}, for each command task check mode skipped that would run.
WOULD_CHANGE_ENV = "GPUPROV_WOULD_CHANGE"
WOULD_CHANGE_FILE = "would-change.jsonl"


def read_would_change(path: Path, hosts: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per host of the run, the task names the callback wrote (a host not in the run, or a
    line that is not such an object, is left out: the file is the run's own, but a task name
    is the play's words, shown as text)."""
    out: dict[str, list[str]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("host") in hosts and isinstance(row.get("task"), str):
            out.setdefault(row["host"], []).append(printable(row["task"]))
    return out


class SecretFiles:
    """Each secret in a file on a memory file system (XDG_RUNTIME_DIR or /dev/shm: never the
    disk), in a private directory, for the length of one run. Yields {variable: file path}."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.secrets = dict(secrets)
        self.dir: str | None = None

    @staticmethod
    def memory_dir() -> str:
        for candidate in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
            if candidate and os.path.isdir(candidate) and _is_memory_fs(candidate):
                return candidate
        raise GpuprovError("no memory file system (XDG_RUNTIME_DIR or /dev/shm) to hand a secret to "
                           "the play without writing it to disk; give the play a password file instead")

    def __enter__(self) -> dict[str, str]:
        import tempfile

        if not self.secrets:
            return {}
        self.dir = tempfile.mkdtemp(prefix="gpuprov-secret-", dir=self.memory_dir())
        out = {}
        for number, (var, value) in enumerate(self.secrets.items()):
            path = os.path.join(self.dir, f"s{number}")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(value)
            out[var] = path
        return out

    def __exit__(self, *exc: object) -> None:
        import shutil

        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _is_memory_fs(path: str) -> bool:
    """True when ``path`` is on tmpfs or ramfs (read from /proc/mounts: the longest mount prefix)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return False
    real = os.path.realpath(path)
    best = max((m for m in mounts if real == m[0] or real.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return best is not None and best[1] in ("tmpfs", "ramfs")


def _stdout_tail(artifact_dir: Path) -> str:
    try:
        lines = [ln for ln in (artifact_dir / "stdout").read_text().splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return printable(" | ".join(lines[-3:])) if lines else "no output"
