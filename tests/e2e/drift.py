"""Helpers of the drift tests in test_docker_cluster.py (issue 34): a converged node carries its
manifest, a no-op `provision` runs no Ansible where it holds, and each kind of drift the plays
repair is caught, planned by `--check` without a change, and fixed by the next `provision` on
that node alone. They run on that file's cluster (one node from scratch, one from the baked
image): a manifest is written by a run of the whole site, which that cluster has had; a
cluster of their own converged from scratch cost the suite about 1000 s on two cores.

Drift the plays repair on a container node, each caught and fixed: a managed file edited (the
driver's apt pin), a file removed (the unattended-upgrades guard), a held package unheld, a
held package removed, a service stopped (Docker), a service disabled (nvidia-persistenced). A
changed sysctl and a missing DKMS module for a new kernel are the unit tests'
(tests/unit/test_manifest_node.py): these plays set no sysctl on a node without EFA, and a
container has no kernel of its own."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

PIN = "/etc/apt/preferences.d/gpuprov-nvidia-driver.pref"
GUARD = "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"
MANIFEST = "/var/lib/gpuprov/manifest.json"

# What is done to a node by hand, and the words the check says of each (the removed package's
# version filled in).
DRIFT = (
    f"echo '# by hand' >> {PIN}",
    f"rm {GUARD}",
    "apt-mark unhold nvidia-driver >/dev/null",
    "apt-mark unhold nvidia-smi >/dev/null && dpkg -r --force-depends nvidia-smi >/dev/null 2>&1",
    "systemctl stop docker.socket docker",
    "systemctl disable nvidia-persistenced 2>/dev/null",
)
WORDS = (
    f"{PIN}: sha256 changed",
    f"{GUARD}: missing",
    "package nvidia-driver: no longer held",
    "package nvidia-smi: removed (was {})",
    "docker: inactive (was active)",
    "nvidia-persistenced: disabled (was enabled)",
)


def provision(name: str, env: dict[str, str], *flags: str, code: int = 0) -> tuple[dict, str]:
    """`provision NAME FLAGS -o json`, exiting ``code`` (3: `--check` found changes pending)."""
    proc = run_cli("provision", name, *flags, "-o", "json", env=env, timeout=900)
    assert proc.returncode == code, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def last_run(name: str, env: dict[str, str]) -> dict:
    return json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"][0]


def ansible_hosts(run: dict) -> set[str]:
    """The hosts Ansible ran a task on in a run, from its recorded events (none: no play ran)."""
    events = Path(run["artifact_dir"]) / "artifacts" / "ansible" / "job_events"
    if not events.is_dir():
        return set()
    hosts = set()
    for path in events.glob("*.json"):
        event = json.loads(path.read_text())
        if event.get("event") == "runner_on_ok" and (event.get("event_data") or {}).get("host"):
            hosts.add(event["event_data"]["host"])
    return hosts


def assert_manifests(env: dict[str, str], name: str, nodes: list[str]) -> None:
    """Issue 34: each node holds the manifest of its last whole-site run, root's alone (the login
    user reads nothing of it), and the state records its digest."""
    from tests.e2e.nodes import node_sh

    spec = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["spec"]
    for node in nodes:
        assert node_sh(node, f"stat -c '%a %U' {MANIFEST}").split() == ["600", "root"]
        digest = node_sh(node, f"sha256sum {MANIFEST}").split()[0]
        record = spec["manifests"][node]
        assert (record["digest"], record["scope"]) == (digest, "site")
        items = {(i["kind"], i["name"]) for i in json.loads(node_sh(node, f"cat {MANIFEST}"))["items"]}
        # daemon.json too on a node from the baked image, whose run needed no write of it (issue 34).
        assert {("path", PIN), ("path", GUARD), ("path", "/etc/docker/daemon.json"), ("package", "nvidia-driver"),
                ("package", "nvidia-smi"), ("service", "docker"), ("service", "nvidia-persistenced")} <= items, node
    assert "Permission denied" in node_sh(nodes[0], f"su -s /bin/sh gpuprov -c 'cat {MANIFEST}' 2>&1")


def assert_verified(result: dict, hosts: set[str]) -> None:
    """A `verify -o json` of the whole stack on local nodes: every probe passes or skips with its
    reason, the stack's own probes pass (driver 535.309.01 built by DKMS, CUDA, cuDNN), and what a
    container cannot have (a GPU, NVSwitch) skips saying so."""
    assert result["ok"] is True and result["summary"]["fail"] == 0
    assert set(result["hosts"]) == hosts
    for host, probes in result["hosts"].items():
        by_name = {p["probe"]: p for p in probes}
        assert by_name["os_supported"]["status"] == "pass"
        assert by_name["unattended_upgrades_leave_gpu_packages"]["status"] == "pass"
        assert by_name["gpu_fact_matches_pci_bus"]["status"] == "pass"
        smi = by_name["nvidia_smi_sees_gpus"]
        assert smi["status"] == "skip" and "no GPU" in smi["detail"], smi
        for probe in ("driver_packages_match_the_lock", "gpu_packages_are_held",
                      "nouveau_blacklisted", "dkms_module_for_every_kernel",
                      "nvcc_reports_the_locked_cuda", "nvcc_compiles_for_the_locked_architectures",
                      "cuda_prefix_and_environment",
                      "cudnn_matches_the_lock"):
            assert by_name[probe]["status"] == "pass", (host, by_name[probe])
        assert "535.309.01" in by_name["dkms_module_for_every_kernel"]["detail"]
        fm = by_name["fabric_manager_matches_driver"]
        assert fm["status"] == "skip" and "no NVSwitch" in fm["detail"], fm
        for p in probes:
            assert p["detail"], (host, p)
    assert result["summary"]["pass"] + result["summary"]["skip"] == sum(
        len(v) for v in result["hosts"].values())
