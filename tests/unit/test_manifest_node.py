"""The node program of the manifest (gpuprov/manifest/node.py), run as the node runs it
(``python3 -I -S``, the request on stdin) on a temporary tree (``--root``): what a snapshot
records and writes, and each kind of drift a check then names.

Packages are read by the real dpkg-query from a dpkg status file in the tree (--admindir).
Services: this machine runs no systemd, so ``systemctl`` is a FIXTURE stand-in on PATH that
answers ``systemctl show`` from a JSON file of the test (the one part not real here; the
end-to-end test, tests/e2e/test_docker_cluster.py with tests/e2e/drift.py, runs the real one on real nodes)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.manifest import remote
from tests.unit.node_programs import write_status

NODE = Path(remote.__file__).resolve().parent / "node.py"
ME = {"gpuprov": "0.1.0", "program": "p" * 64}
FIXTURE_SYSTEMCTL = """#!/usr/bin/env python3
# FIXTURE: `systemctl show --property=... -- UNIT...` answered from $ROOT/fixture-units.json
import json, os, sys
units = json.load(open(os.path.join(os.environ["FIXTURE_ROOT"], "fixture-units.json")))
names = sys.argv[sys.argv.index("--") + 1:]
print("\\n\\n".join(f"Id={n}.service\\nUnitFileState={units[n][0]}\\nActiveState={units[n][1]}" for n in names))
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    files = {
        "etc/docker/daemon.json": '{"runtimes": {"nvidia": {}}}\n',
        "etc/apt/preferences.d/nvidia-driver": "Package: nvidia-driver-580\nPin: version 580.159.04-1\n",
        "etc/sysctl.d/90-gpuprov-efa.conf": "# EFA\nkernel.yama.ptrace_scope = 0\n",
        "etc/modules-load.d/nvidia.conf": "nvidia\nnvidia_peermem\n",
        "proc/sys/kernel/yama/ptrace_scope": "0\n",
        "etc/os-release": 'ID=debian\nVERSION_ID="12"\n',
        "fixture-units.json": json.dumps({"nvidia-persistenced": ["enabled", "active"]}),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "var/lib/dpkg/info").mkdir(parents=True)
    (root / "var/lib/dpkg/updates").mkdir()
    write_status(root, {"nvidia-driver-580": ("hold", "580.159.04-1"), "libnccl2": ("install", "2.16.5-1")})
    bin_dir = tmp_path / "fixture-bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FIXTURE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    return root


ITEMS = [
    {"kind": "path", "name": "/etc/docker/daemon.json"},
    {"kind": "path", "name": "/etc/apt/preferences.d/nvidia-driver"},
    {"kind": "path", "name": "/etc/sysctl.d/90-gpuprov-efa.conf"},
    {"kind": "path", "name": "/etc/modules-load.d/nvidia.conf"},
    {"kind": "path", "name": "/etc/nouveau-absent.conf"},
    {"kind": "package", "name": "nvidia-driver-580"},
    {"kind": "package", "name": "libnccl2"},
    {"kind": "service", "name": "nvidia-persistenced"},
]


def node(root: Path, action: str, request: dict) -> dict:
    env = {"PATH": f"{root.parent / 'fixture-bin'}:{os.environ['PATH']}", "FIXTURE_ROOT": str(root)}
    proc = subprocess.run([sys.executable, "-I", "-S", str(NODE), "--root", str(root), action],
                          input=json.dumps(request), capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout)


def snap(root: Path, items: list[dict] | None = None, scope: str = "site") -> dict:
    return node(root, "snapshot", {**ME, "scope": scope, "items": ITEMS if items is None else items})


def recorded(root: Path) -> set[tuple[str, str]]:
    data = json.loads((root / "var/lib/gpuprov/manifest.json").read_text())
    return {(i["kind"], i["name"]) for i in data["items"]}


def test_a_snapshot_records_every_item_root_only_and_its_digest(tree: Path) -> None:
    answer = snap(tree)
    manifest = tree / "var/lib/gpuprov/manifest.json"
    data = manifest.read_bytes()
    assert answer["digest"] == hashlib.sha256(data).hexdigest()
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o600 and manifest.stat().st_uid == os.getuid()
    assert stat.S_IMODE(manifest.parent.stat().st_mode) == 0o700  # made here: it was missing
    found = {(i["kind"], i["name"]): i["state"] for i in json.loads(data)["items"]}
    # 8 asked for, and what the managed files set: one sysctl key, two kernel modules.
    assert answer["items"] == len(found) == 11
    assert found[("path", "/etc/docker/daemon.json")]["sha256"] == hashlib.sha256(
        (tree / "etc/docker/daemon.json").read_bytes()).hexdigest()
    assert found[("path", "/etc/nouveau-absent.conf")] == {"exists": False}
    assert found[("package", "nvidia-driver-580")] == {"version": "580.159.04-1", "hold": True}
    assert found[("package", "libnccl2")] == {"version": "2.16.5-1", "hold": False}
    assert found[("service", "nvidia-persistenced")] == {"enabled": "enabled", "active": "active"}
    assert found[("sysctl", "kernel.yama.ptrace_scope")] == {"value": "0"}
    assert found[("module", "nvidia")] == {"loaded": True}
    assert found[("module", "nvidia_peermem")] == {"loaded": False}
    assert json.loads(data)["inputs"]["os"] == {"ID": "debian", "VERSION_ID": "12"}


def test_the_same_node_snapshots_to_the_same_bytes(tree: Path) -> None:
    assert snap(tree)["digest"] == snap(tree)["digest"]


def test_every_held_package_is_an_item_whatever_the_run_said(tree: Path) -> None:
    """The roles hold what they install with apt-mark; on a converged node the install task is
    skipped, so the run names no package: the holds are read on the node."""
    snap(tree, [{"kind": "path", "name": "/etc/docker/daemon.json"}])
    assert recorded(tree) == {("path", "/etc/docker/daemon.json"), ("package", "nvidia-driver-580")}
    write_status(tree, {"nvidia-driver-580": ("install", "580.159.04-1")})
    assert node(tree, "check", ME)["drift"] == ["package nvidia-driver-580: no longer held"]


def test_a_rerun_of_the_same_plays_keeps_what_the_first_one_managed(tree: Path) -> None:
    """The second run skips the tasks that changed something on the first (probe, then act)."""
    snap(tree)
    snap(tree, [{"kind": "path", "name": "/etc/docker/daemon.json"}])
    assert len(recorded(tree)) == 11
    snap(tree, [{"kind": "path", "name": "/etc/docker/daemon.json"}], scope="driver")  # other plays
    assert recorded(tree) == {("path", "/etc/docker/daemon.json"), ("package", "nvidia-driver-580")}


def test_a_directory_the_roles_manage_is_left_as_it_is(tree: Path) -> None:
    """/var/lib/gpuprov is the roles' (0755): the manifest's own mode is enough."""
    (tree / "var/lib/gpuprov").mkdir(parents=True)
    (tree / "var/lib/gpuprov").chmod(0o755)
    snap(tree, [*ITEMS, {"kind": "path", "name": "/var/lib/gpuprov"}])
    assert stat.S_IMODE((tree / "var/lib/gpuprov").stat().st_mode) == 0o755
    assert node(tree, "check", ME)["state"] == "held"


def test_a_node_as_it_was_left_holds(tree: Path) -> None:
    snap(tree)
    assert node(tree, "check", ME) == {"state": "held", "digest": snap(tree)["digest"], "items": 11, "drift": []}


def test_each_kind_of_drift_is_named(tree: Path) -> None:
    snap(tree)
    (tree / "etc/docker/daemon.json").write_text("{}\n")
    (tree / "etc/apt/preferences.d/nvidia-driver").chmod(0o666)
    (tree / "etc/nouveau-absent.conf").write_text("x\n")
    (tree / "proc/sys/kernel/yama/ptrace_scope").write_text("1\n")
    (tree / "sys/module/nvidia").rmdir()
    write_status(tree, {"nvidia-driver-580": ("install", "580.159.04-1")})
    (tree / "fixture-units.json").write_text(json.dumps({"nvidia-persistenced": ["enabled", "inactive"]}))
    answer = node(tree, "check", ME)
    assert answer["state"] == "drifted"
    assert sorted(answer["drift"]) == sorted([
        "/etc/docker/daemon.json: sha256 changed",
        "/etc/apt/preferences.d/nvidia-driver: mode 0644 -> 0666",
        "/etc/nouveau-absent.conf: exists (it was removed)",
        "sysctl kernel.yama.ptrace_scope: 0 -> 1",
        "module nvidia: not loaded",
        "package nvidia-driver-580: no longer held",
        "package libnccl2: removed (was 2.16.5-1)",
        "nvidia-persistenced: inactive (was active)",
    ])


@pytest.mark.parametrize(("recorded_state", "now", "drift"), [
    # A node without a GPU starts the enabled nvidia-persistenced at boot and it fails there: the
    # run's end may record it on its way down, the next read finds it failed (stop 71's CI failure).
    ("deactivating", "failed", []),
    ("failed", "inactive", []),
    ("active", "activating", []),
    ("reloading", "active", []),
    ("deactivating", "active", ["nvidia-persistenced: active (was deactivating)"]),
    ("active", "failed", ["nvidia-persistenced: failed (was active)"]),
])
def test_a_service_compares_by_its_settled_state(tree: Path, recorded_state: str, now: str,
                                                 drift: list[str]) -> None:
    (tree / "fixture-units.json").write_text(json.dumps({"nvidia-persistenced": ["enabled", recorded_state]}))
    snap(tree)
    (tree / "fixture-units.json").write_text(json.dumps({"nvidia-persistenced": ["enabled", now]}))
    answer = node(tree, "check", ME)
    assert answer["drift"] == drift
    assert answer["state"] == ("drifted" if drift else "held")


def test_a_removed_file_and_a_moved_package(tree: Path) -> None:
    snap(tree)
    (tree / "etc/docker/daemon.json").unlink()
    write_status(tree, {"nvidia-driver-580": ("hold", "580.160.01-1"), "libnccl2": ("install", "2.16.5-1")})
    assert sorted(node(tree, "check", ME)["drift"]) == [
        "/etc/docker/daemon.json: missing", "package nvidia-driver-580: 580.159.04-1 -> 580.160.01-1"]


@pytest.mark.parametrize("other", [{"gpuprov": "0.0.9"}, {"program": "q" * 64}])
def test_a_manifest_of_another_gpuprov_is_not_read(tree: Path, other: dict) -> None:
    snap(tree)
    answer = node(tree, "check", {**ME, **other})
    assert answer["state"] == "other-version" and answer["drift"][0].startswith("/var/lib/gpuprov/manifest.json: ")


def test_a_missing_or_damaged_manifest_says_so(tree: Path) -> None:
    assert node(tree, "check", ME)["state"] == "missing"
    snap(tree)
    (tree / "var/lib/gpuprov/manifest.json").write_text("{not json")
    assert node(tree, "check", ME)["state"] == "unreadable"


def test_usage_is_refused_with_exit_2(tree: Path) -> None:
    proc = subprocess.run([sys.executable, "-I", "-S", str(NODE), "remove"], capture_output=True, text=True,
                          check=False, input="{}")
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1


def test_the_program_imports_the_standard_library_only() -> None:
    """It is sent to the node as it is, and the node runs it without site-packages."""
    import ast

    tree = ast.parse(NODE.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_shipped_program_is_the_file_and_its_command_quotes_it_whole() -> None:
    assert remote.program() == NODE.read_bytes()
    assert remote.identity()["program"] == hashlib.sha256(NODE.read_bytes()).hexdigest()
    # The command a node's shell runs: parsed back, the program is one argument, byte for byte.
    import shlex

    words = shlex.split(remote.command("check").split("; then exec ", 1)[1].split("; else", 1)[0])
    assert words == ["python3", "-I", "-S", "-c", NODE.read_text(), "check"]


def test_a_new_kernel_without_its_dkms_module_and_other_inputs_are_named() -> None:
    from gpuprov.manifest import node as program

    was = {"kernel": "6.1.0-28-amd64", "os": {"ID": "debian", "VERSION_ID": "12"}, "gpus": ["GPU 0: A100"],
           "dkms": ["nvidia-current/535.261.03, 6.1.0-28-amd64, x86_64: installed"]}
    built = {**was, "kernel": "6.1.0-31-amd64", "dkms": [*was["dkms"],
                                                          "nvidia-current/535.261.03, 6.1.0-31-amd64, x86_64: installed"]}
    assert program.inputs_drift(was, was) == []
    assert program.inputs_drift(was, {**was, "kernel": "6.1.0-31-amd64"}) == [
        "kernel 6.1.0-28-amd64 -> 6.1.0-31-amd64: DKMS module not built"]
    assert program.inputs_drift(was, built) == ["kernel 6.1.0-28-amd64 -> 6.1.0-31-amd64"]
    assert program.inputs_drift(was, {**was, "gpus": []}) == ["GPUs: 1 -> 0 (none answer)"]
    assert program.inputs_drift({**was, "gpus": []}, {**was, "gpus": None}) == []  # nvidia-smi removed
    assert program.inputs_drift(was, {**was, "os": {"ID": "debian", "VERSION_ID": "13"}}) == ["OS debian 12 -> debian 13"]


# DKMS's tree as dkms 3.0.10 (Debian 12) left it in a bookworm node container on 2026-11-28
# after `dkms add hello/1.0 && dkms build hello/1.0 -k K && dkms install hello/1.0 -k K`,
# `dkms add hello/1.1 && dkms build hello/1.1 -k K` and `dkms add other/2.0` (a two-line test
# module), with what `dkms status` printed for it: (kind, path, link target).
DKMS_TREE = [("d", "hello/1.0/6.1.0-56-amd64/x86_64/log", ""), ("f", "hello/1.0/6.1.0-56-amd64/x86_64/module/hello.ko", ""),
             ("d", "hello/1.1/6.1.0-56-amd64/x86_64/log", ""), ("f", "hello/1.1/6.1.0-56-amd64/x86_64/module/hello.ko", ""),
             ("d", "other/2.0/build", ""), ("f", "mok.key", ""), ("f", "mok.pub", ""),
             ("l", "hello/1.0/source", "/usr/src/hello-1.0"), ("l", "hello/1.1/source", "/usr/src/hello-1.1"),
             ("l", "hello/kernel-6.1.0-56-amd64-x86_64", "1.0/6.1.0-56-amd64/x86_64"),
             ("l", "other/2.0/source", "/usr/src/other-2.0")]
DKMS_STATUS = ["hello/1.0, 6.1.0-56-amd64, x86_64: installed", "hello/1.1, 6.1.0-56-amd64, x86_64: built",
               "other/2.0: added"]


def test_dkms_modules_are_read_from_the_tree_as_dkms_status_lists_them(tmp_path: Path, monkeypatch) -> None:
    """The check reads DKMS's tree instead of running `dkms status` (which diffs every built
    module with its installed copy: the NVIDIA driver's, on every check); the lines are the
    ones dkms printed for the same tree, so a manifest's DKMS input means what it meant."""
    from gpuprov.manifest import node as program

    monkeypatch.setattr(program, "ROOT", str(tmp_path))
    assert program.dkms_status() is None  # no DKMS on the node
    tree = tmp_path / "var/lib/dkms"
    for kind, rel, target in DKMS_TREE:
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "d":
            path.mkdir(exist_ok=True)
        elif kind == "f":
            path.write_bytes(b"\x7fELF")
        else:
            path.symlink_to(target)  # the sources' links dangle here, as under any other root
    assert program.dkms_status() == DKMS_STATUS
    # The module is installed for the other version: the link moves, the two lines swap.
    (tree / "hello/kernel-6.1.0-56-amd64-x86_64").unlink()
    (tree / "hello/kernel-6.1.0-56-amd64-x86_64").symlink_to("1.1/6.1.0-56-amd64/x86_64")
    assert program.dkms_status() == ["hello/1.0, 6.1.0-56-amd64, x86_64: built",
                                     "hello/1.1, 6.1.0-56-amd64, x86_64: installed", "other/2.0: added"]
    # A build whose modules are gone is not built (dkms: is_module_built); its version is added.
    (tree / "hello/1.1/6.1.0-56-amd64/x86_64/module/hello.ko").unlink()
    assert program.dkms_status() == ["hello/1.0, 6.1.0-56-amd64, x86_64: built", "hello/1.1: added",
                                     "other/2.0: added"]


def test_the_gpu_census_is_read_where_the_driver_lists_its_gpus(tmp_path: Path, monkeypatch) -> None:
    """The census the plays depended on, from /proc/driver/nvidia/gpus (the recording of the
    real H200 VM, tests/fixtures/recordings/h200-580/proc-driver.txt), not by starting
    nvidia-smi on every check; no driver loaded is no census."""
    from gpuprov.manifest import node as program
    from tests.fixtures.recorded_node import proc_driver

    monkeypatch.setattr(program, "ROOT", str(tmp_path))
    assert program.gpu_census() is None
    recording = Path(__file__).resolve().parents[1] / "fixtures/recordings/h200-580/proc-driver.txt"
    for rel, text in proc_driver(recording.read_text()).items():
        path = tmp_path / "proc/driver" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert program.gpu_census() == ["0000:00:06.0 NVIDIA H200"]
    was = {"kernel": "k", "os": {}, "gpus": program.gpu_census(), "dkms": None}
    shutil.rmtree(tmp_path / "proc/driver/nvidia/gpus/0000:00:06.0")
    assert program.inputs_drift(was, {**was, "gpus": program.gpu_census()}) == ["GPUs: 1 -> 0 (none answer)"]
