"""Run a playbook with ansible-runner; stream its events into per-node progress."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles


@dataclass(frozen=True)
class PlaybookResult:
    ok: bool
    rc: int
    status: str
    hosts: dict[str, dict[str, int]]
    errors: dict[str, str]
    artifact_dir: Path


def new_run_dir(files: ClusterFiles, kind: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    path = files.runs / f"{stamp}-{kind}"
    path.mkdir(parents=True, mode=0o700)
    return path


def run_playbook(
    playbook: Path,
    files: ClusterFiles,
    hosts: Sequence[str],
    run_dir: Path,
    *,
    title: str,
    check: bool = False,
    tags: str | None = None,
    limit: str | None = None,
    extravars: Mapping[str, Any] | None = None,
    console: Any | None = None,
) -> PlaybookResult:
    import ansible_runner

    from gpuprov.ansible.progress import PlaybookProgress

    # ansible-runner starts `ansible-playbook` from PATH: make it the one that
    # belongs to this interpreter, even when the venv is not activated.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    cmdline = []
    if check:
        cmdline += ["--check", "--diff"]
    if tags:
        cmdline += ["--tags", tags]
    if limit:
        cmdline += ["--limit", limit]

    progress = PlaybookProgress(hosts, title, console=console)
    with progress:
        result = ansible_runner.run(
            private_data_dir=str(run_dir),
            playbook=str(playbook),
            inventory=str(files.inventory),
            envvars={
                "ANSIBLE_CONFIG": str(files.ansible_cfg),
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0",
            },
            extravars=dict(extravars or {}),
            cmdline=" ".join(cmdline) or None,
            event_handler=progress.handle,
            quiet=True,
            ident="ansible",
        )
    artifact_dir = run_dir / "artifacts" / "ansible"
    if progress.stats is None and result.status != "successful":
        tail = _stdout_tail(artifact_dir)
        raise GpuprovError(
            f"ansible-playbook did not run ({result.status}, rc={result.rc}): {tail}"
            f" (full log: {artifact_dir / 'stdout'})"
        )
    hosts_summary = progress.summary()
    ok = result.rc == 0 and all(h["failed"] == 0 and h["unreachable"] == 0 for h in hosts_summary.values())
    return PlaybookResult(
        ok=ok,
        rc=int(result.rc),
        status=str(result.status),
        hosts=hosts_summary,
        errors=progress.errors(),
        artifact_dir=artifact_dir,
    )


def _stdout_tail(artifact_dir: Path) -> str:
    try:
        lines = [ln for ln in (artifact_dir / "stdout").read_text().splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return " | ".join(lines[-3:]) if lines else "no output"
