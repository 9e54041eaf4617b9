"""What a run's plays manage on a node, read from the run's own task results.

tests/fixtures/manifest_events.json holds real ansible-runner events (its ``source`` says which
run): a local node bootstrapped with the preflight and driver plays from the fixture mirror."""

from __future__ import annotations

import io
import json
from pathlib import Path

from gpuprov.ansible.progress import PlaybookProgress
from gpuprov.manifest import collect

FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "manifest_events.json").read_text())
EVENTS = FIXTURE["events"]
HOST = "drdev-node-1"


def test_a_real_runs_events_name_what_the_driver_play_manages() -> None:
    found = collect.from_events(EVENTS)[HOST]
    assert {(i["kind"], i["name"]) for i in found} == {
        # installed by the play's apt tasks
        ("package", "nvidia-driver-580-open"), ("package", "nvidia-dkms-580-open"),
        ("package", "nvidia-driver-pinning-580.159.04"),
        # written by its copy, template, file and get_url tasks: apt's source, pin and settings
        ("path", "/etc/apt/sources.list.d/gpuprov-nvidia-mirror.sources"),
        ("path", "/etc/apt/preferences.d/gpuprov-nvidia-driver.pref"),
        ("path", "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"),
        ("path", "/etc/apt/apt.conf.d/52gpuprov-nvidia-driver"),
        ("path", "/etc/apt/keyrings"), ("path", "/var/tmp/gpuprov-nvidia-mirror.key"),
        ("path", "/etc/modprobe.d/gpuprov-blacklist-nouveau.conf"),
        ("path", "/etc/ansible/facts.d"), ("path", "/etc/ansible/facts.d/gpu.fact"),
        ("path", "/var/lib/gpuprov"), ("path", "/var/lib/gpuprov/nvidia_driver.json"),
        # enabled by its systemd_service task
        ("service", "nvidia-persistenced"),
    }
    assert found == sorted(found, key=lambda i: (i["kind"], i["name"]))


def test_skipped_tasks_and_commands_name_nothing() -> None:
    quiet = [e for e in EVENTS if e["event"] == "runner_on_skipped"
             or e["event_data"]["task_action"] in ("ansible.builtin.command", "ansible.builtin.shell")]
    assert quiet and collect.from_events(quiet) == {HOST: []}


def test_what_the_progress_keeps_names_the_same_items() -> None:
    """The run's own capture (PlaybookProgress, which keeps a few keys of each result) and the
    events as recorded give the same items."""
    from rich.console import Console

    progress = PlaybookProgress([HOST], "t", console=Console(file=io.StringIO()))
    for event in EVENTS:
        progress.handle(event)
    assert collect.collect(progress.results[HOST]) == collect.from_events(EVENTS)[HOST]
    kept = json.dumps(progress.results[HOST])
    assert "content" not in kept and "diff" not in kept  # what a file holds is never kept


def test_loops_versions_and_files_by_path() -> None:
    loop = {"results": [
        {"invocation": {"module_args": {"name": ["docker.io=20.10*", "rdma-core"], "state": "present"}}},
        {"skipped": True, "invocation": {"module_args": {"name": "skipped-pkg"}}},
        {"invocation": {"module_args": {"deb": "/tmp/x.deb", "name": None}}},
    ]}
    assert collect.items_of("ansible.builtin.apt", loop) == [
        {"kind": "package", "name": "docker.io"}, {"kind": "package", "name": "rdma-core"}]
    assert collect.items_of("ansible.builtin.lineinfile", {"invocation": {"module_args": {"path": "/etc/x"}}}) == [
        {"kind": "path", "name": "/etc/x"}]
    assert collect.items_of("ansible.builtin.file", {"path": "relative/x"}) == []
    assert collect.items_of("ansible.builtin.systemd_service", {"invocation": {"module_args": {
        "daemon_reload": True, "name": None}}}) == []
    assert collect.items_of("ansible.builtin.debug", {"msg": "/etc/x"}) == []
