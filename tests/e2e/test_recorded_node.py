"""gpuprov's unchanged probes and health checks on recorded-hardware nodes
(tests/fixtures/recorded_node.py, a labelled FIXTURE): local nodes whose nvidia-smi, lspci,
PCI bus (/sys/bus/pci/devices) and /proc/driver show the real H100 recorded in
tests/fixtures/recordings/h100-sxm5-580/, or an edited copy of it showing one fault.

The nodes are adopted the way a user adopts an existing machine: a static hosts file that
declares `gpus: 1`, `up --provider static --driver 580 --no-bootstrap` (the model, H100,
comes from the PCI bus the host shows). The recordings are installed when every node is the
healthy H100, so all five share the lock of a 1 x H100 host (R580, open module); the edited
copies are swapped in after `up`: a machine that broke after it was adopted.

The same nodes run `gpuprov verify --local` themselves (gpuprov copied in), as the real H100
ran its probes; a CUDA context there comes from the node's FIXTURE libcuda.so.1, which answers
from the recording.

Nothing is bootstrapped (no playbook runs: the suite's time), so the probes of installed
packages fail on every node for that reason; the test names each probe's outcome, and on the
edited nodes exactly the probe that reads the edited file changes.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fixtures import recorded_node
from tests.hostfacts import microcode

pytestmark = pytest.mark.e2e

BASE = "h100-sxm5-580"
# Node name -> the edited copy served over the H100 recording (None: the recording as taken).
NODES = {
    "h100": None,
    "h100-proprietary": "h100-proprietary-edited",
    "h100-gpu-gone": "h100-sxm5-580-edited-gpu-gone",
    "h100-nvswitch": "hgx-h100-edited",
    "h100-gpu-lost": "h100-sxm5-580-edited-gpu-lost",
}


def _microcode_outcomes() -> dict[str, tuple[str, str]]:
    """The microcode probes on a node that was never bootstrapped, for this machine's CPU."""
    found = microcode()
    if found is None:
        reason = "has no microcode package (Intel and AMD only)"
        return {p: ("skip", reason) for p in ("microcode_package_matches_the_pin", "microcode_loaded_early",
                                               "microcode_running_revision_or_reboot_flagged")}
    package, path, key = found
    return {
        "microcode_package_matches_the_pin": ("fail", f"expected {package} installed"),
        "microcode_loaded_early": ("fail", f"expected {key}=early in {path}, found nothing"),
        "microcode_running_revision_or_reboot_flagged": ("fail", "gpuprov_microcode.fact"),
    }


# The probes of the healthy H100 node, each with its outcome and a piece of its detail.
HEALTHY = {
    # What the real H100 passed (probes-gpu-lock580.jsonl), and the flavour probe written
    # since, on /proc/driver/nvidia/version as recorded.
    "gpus_on_pci_bus": ("pass", "1 NVIDIA GPU(s) on the PCI bus, as expected"),
    "nvidia_smi_sees_gpus": ("pass", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-de57134f"),
    "driver_version_persistence_and_model": ("pass", "1 x NVIDIA H100 80GB HBM3, driver 580.159.04"),
    "running_kernel_module_flavour_matches_the_lock": ("pass", "open kernel module 580.159.04 loaded"),
    # The probe's python3 loads libcuda.so.1: here the recorded node's FIXTURE library, which
    # answers from the recording (the real CUDA run's driver API version and compute
    # capability, the GPUs nvidia-smi's CSV of ids lists).
    "cuda_context_can_be_created": ("pass", "CUDA context created on GPU 0; the CUDA driver sees 1 device(s)"),
    # No NVSwitch on the recorded bus, no EFA on an untyped host: skips, as on the real H100.
    "fabric_manager_matches_driver": ("skip", "no NVSwitch on this node's PCI bus"),
    "efa_interfaces_match_the_catalog": ("skip", "has no EFA"),
    # The node's container side, not the recording's.
    "os_supported": ("pass", "debian 12"),
    "dpkg_consistent": ("pass", "nothing to report"),
    "kernel_headers_for_running_kernel": ("skip", "docker container: runs the host's kernel"),
    "memlock_unlimited_for_users": ("skip", "container node: its engine caps memlock"),
    "memlock_unlimited_for_services": ("skip", "container node: its engine caps memlock"),
    "memlock_unlimited_in_containers": ("skip", "container node: its engine caps memlock"),
    # The real H100 failed the three GPU probes of the container stack too (no Docker there).
    # Here: no bootstrap, so no docker; and /sys/module/nvidia cannot be shown in a container
    # without hiding the host's /sys/module (the node's modules are the host kernel's).
    # The gpu_sharing probes (issue 58): the nodes' locks ask no GPU sharing.
    **{f"gpu_sharing_matches_the_lock_{claim}": ("skip", "asks no GPU sharing (--gpu-sharing)")
       for claim in ("mig_mode", "no_mig_mode_change_pending", "mig_instances", "mps_daemon")},
    "docker_run_gpus_all_sees_the_gpus": ("fail", "docker: not found"),
    "cuda_base_image_reports_the_locked_cuda": ("fail", "docker: not found"),
    "cdi_spec_matches_the_driver": ("fail", "expected the nvidia module loaded (driver 580.159.04)"),
    # No bootstrap: what the roles install is not there.
    "driver_packages_match_the_lock": ("fail", "expected ['nvidia-dkms-580-open', 'nvidia-driver-580-open']"),
    "gpu_packages_are_held": ("fail", "expected NVIDIA packages installed, found none"),
    "dkms_module_flavour_matches_the_lock": ("fail", "expected at least one kernel with headers for DKMS"),
    "dkms_module_for_every_kernel": ("fail", "expected at least one kernel with headers for DKMS"),
    "nouveau_blacklisted": ("fail", "expected nouveau blacklisted"),
    "unattended_upgrades_leave_gpu_packages": ("fail", "expected unattended-upgrades to skip"),
    "gpu_fact_matches_pci_bus": ("fail", "expected an executable /etc/ansible/facts.d/gpu.fact"),
    "nvcc_reports_the_locked_cuda": ("fail", "expected nvcc on a login shell's PATH, found none"),
    # (written after the real run: the compile probe, for the lock's GPU architecture)
    "nvcc_compiles_for_the_locked_architectures": ("fail", "expected a CUDA program to compile for sm_90"),
    "cuda_prefix_and_environment": ("fail", "expected /usr/local/cuda -> /usr/local/cuda-11.8"),
    "cudnn_matches_the_lock": ("fail", "expected cudnn_version.h to say 8.9.6"),
    # (written after the real run: the nvidia source's lock installs NCCL; nothing here did)
    "nccl_matches_the_lock": ("fail", "expected libnccl2 and libnccl-dev at 2.16.5-1+cuda11.8"),
    "nccl_conf_has_the_expected_keys": ("fail", "expected /etc/nccl.conf"),
    "rdma_userspace_present": ("fail", "expected rdma-core, ibverbs-utils, infiniband-diags installed"),
    "nvidia_peermem_configured": ("fail", "expected nvidia-peermem in /etc/modules-load.d"),
    # The node's CPU is this machine's (containers share its /proc/cpuinfo): which microcode
    # package and early-loading setting the probes look for comes from the host.
    **_microcode_outcomes(),
    "docker_active": ("fail", "expected the docker service active"),
    "docker_lists_the_nvidia_runtime": ("fail", "docker: not found"),
    "container_toolkit_matches_the_lock": ("fail", "expected ['nvidia-container-toolkit'"),
    "daemon_json_keeps_the_keys_from_before": ("fail", "daemon.json.before-gpuprov"),
    "base_images_present": ("fail", "expected the lock's images pulled by digest"),
    "site_image_built_from_the_lock": ("fail", "expected the site image gpuprov/base:cuda11.8-"),
    # (written after the real run: the nvidia source's lock installs DCGM; nothing here did)
    "dcgm_matches_the_lock_and_is_held": ("fail", "expected datacenter-gpu-manager at 1:3.3.0"),
    "dcgm_counters_file_turns_on_every_field_the_alerts_read": ("fail", "expected gpuprov's dcgm-exporter counters file"),
    "dcgm_host_engine_enabled_and_running_with_a_gpu": ("fail", "expected nvidia-dcgm enabled"),
    "dcgm_exporter_runs_the_locked_image_on_one_address": ("fail", "expected the dcgm-exporter unit"),
    # (written after the real run: the Slurm probes skip on a node of a cluster without Slurm)
    **{probe: ("skip", "no Slurm on this node (no /etc/slurm/slurm.conf)") for probe in (
        "munge_key_is_0400_and_owned_by_munge", "munge_encodes_and_decodes_a_credential",
        "slurmctld_active_on_the_controller", "slurmd_active_on_a_compute_node", "slurm_daemons_run_one_version",
        "node_takes_work_in_sinfo", "srun_runs_a_task_on_this_node", "every_task_gets_the_clusters_environment",
        "gres_matches_the_gpus_on_the_pci_bus", "accounting_records_to_slurmdbd")},
}

# Each edited node: exactly these probes differ from the healthy node, with these details.
EDITED = {
    "h100-proprietary": {
        "running_kernel_module_flavour_matches_the_lock": (
            "fail", "expected the open kernel module 580.159.04 running, found the proprietary module "
            "535.309.01 (/proc/driver/nvidia/version)"),
    },
    "h100-gpu-gone": {
        "gpus_on_pci_bus": ("fail", "expected 1 NVIDIA GPU(s) on the PCI bus (configured), found 0"),
        # (The peermem probe judges a node expected to have GPUs even when its bus shows none:
        # it fails here as on the healthy node, nothing being bootstrapped.)
    },
    "h100-nvswitch": {
        "fabric_manager_matches_driver": (
            "fail", "expected a fabric manager in the lock: 4 NVSwitch(es) on this node's PCI bus, but the "
            "lock (resolved for detected:1xH100) has no fabric manager"),
    },
    # nvidia-smi's CSV of ids does not answer for the GPU (gpuprov health's gpu_answers check
    # catches that); no probe reads that query, but the FIXTURE libcuda.so.1 takes its GPUs
    # from it: cuInit fails with CUDA_ERROR_UNKNOWN (999), and every later call with
    # CUDA_ERROR_NOT_INITIALIZED (3), so no device and no context.
    "h100-gpu-lost": {
        "cuda_context_can_be_created": (
            "fail", "expected a CUDA context on GPU 0 (all CUresult 0), found: [999, 3, 3, 3] 0"),
    },
}
# What the real H100 passed with a 580 lock (probes-gpu-lock580.jsonl, pytest -m gpu there).
REAL_PASSES = {"gpus_on_pci_bus", "nvidia_smi_sees_gpus", "driver_version_persistence_and_model",
               "cuda_context_can_be_created"}


def _docker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=60)


@pytest.fixture(scope="module")
def cluster(env: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """The static cluster of five recorded nodes: {node name: container id}."""
    base, name = f"recb-{secrets.token_hex(3)}", f"rec-{secrets.token_hex(3)}"
    try:
        up = run_cli("up", "--provider", "docker", "--count", str(len(NODES)), "--name", base,
                     "--no-bootstrap", "-o", "json", env=env, timeout=300)
        assert up.returncode == 0, up.stderr
        made = json.loads(up.stdout)["nodes"]
        containers = {node: made[i]["id"] for i, node in enumerate(NODES)}
        for cid in containers.values():
            recorded_node.install(cid, BASE)
        cdir = Path(env["GPUPROV_HOME"]) / "clusters" / base
        lines = [f"known_hosts: {cdir / 'known_hosts'}", "user: gpuprov", f"key: {cdir / 'id_ed25519'}",
                 "hosts:"]
        for i, node in enumerate(NODES):
            lines += [f"  - name: {node}", "    address: 127.0.0.1", f"    port: {made[i]['ssh_port']}",
                      "    gpus: 1"]
        hosts = tmp_path_factory.mktemp("recorded") / "hosts.yml"
        hosts.write_text("\n".join(lines) + "\n")
        adopt = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", name, "--driver", "580",
                        "--no-bootstrap", "-o", "json", env=env)
        assert adopt.returncode == 0, adopt.stderr
        assert adopt.stderr.count("PCI bus: 1 NVIDIA GPU(s), 0 NVSwitch(es) -> detected:1xH100") == len(NODES)
        for node, overlay in NODES.items():
            if overlay:
                served = recorded_node.install(containers[node], BASE, overlay)
                assert served == f"{BASE} + {overlay}"
        yield name, containers
    finally:
        run_cli("down", name, "--yes", env=env)
        run_cli("down", base, "--yes", env=env)
        ids = _docker("ps", "-aq", "--filter", f"label=gpuprov.cluster={base}").stdout.split()
        if ids:
            _docker("rm", "-f", "-v", *ids)


@pytest.fixture(scope="module")
def verified(cluster, env):
    """`gpuprov verify NAME -o json`, once: {node: {probe: row}}."""
    name, _ = cluster
    proc = run_cli("verify", name, "-o", "json", env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr  # the nodes are not bootstrapped: probes fail
    hosts = json.loads(proc.stdout)["hosts"]
    return {h: {r["probe"]: r for r in rows} for h, rows in hosts.items()}


def _outcomes(rows: dict[str, dict[str, str]]) -> dict[str, str]:
    return {p: r["status"] for p, r in rows.items()}


def test_the_lock_is_r580_open_for_the_declared_h100(cluster, env) -> None:
    status = json.loads(run_cli("status", cluster[0], "-o", "json", env=env, check=True).stdout)
    lock = status["stack"]
    assert (lock["instance_type"], lock["driver"], lock["kernel_module"], lock["fabricmanager"]) == (
        "detected:1xH100", "580.159.04", "open", None), lock


def test_the_healthy_recording_passes_what_the_real_h100_passed(verified) -> None:
    rows = verified["h100"]
    assert _outcomes(rows) == {p: s for p, (s, _) in HEALTHY.items()}, {
        p: (r["status"], r["detail"][:120]) for p, r in rows.items()}
    for probe, (_, detail) in HEALTHY.items():
        assert detail in rows[probe]["detail"], (probe, rows[probe]["detail"])
    # The real machine's own run (gpuprov's probes with a 580 lock, on the H100 itself): every
    # probe it passed passes here with the very same detail.
    passed = _real_passes()
    assert set(passed) == REAL_PASSES
    for probe, detail in passed.items():
        assert rows[probe] == {"probe": probe, "status": "pass", "detail": detail}


def _real_passes() -> dict[str, str]:
    real = [json.loads(line) for line in
            (recorded_node.RECORDINGS / BASE / "probes-gpu-lock580.jsonl").read_text().splitlines()]
    return {r["probe"]: r["detail"] for r in real if r["status"] == "pass"}


@pytest.mark.parametrize("node", [n for n in NODES if NODES[n]])
def test_an_edited_recording_fails_exactly_its_probe(verified, node: str) -> None:
    healthy, rows = verified["h100"], verified[node]
    changed = {p: (r["status"], r["detail"]) for p, r in rows.items()
               if (r["status"], r["detail"]) != (healthy[p]["status"], healthy[p]["detail"])}
    assert set(changed) == set(EDITED[node]) and set(rows) == set(healthy), changed
    for probe, (status, detail) in EDITED[node].items():
        assert changed[probe][0] == status and detail in changed[probe][1], (probe, changed[probe])


@pytest.fixture(scope="module")
def verified_locally(cluster) -> dict[str, tuple[int, dict[str, dict[str, str]]]]:
    """`gpuprov verify --local --gpus 1 --gpu-model H100 --driver 580 --only gpu -o json` run
    by the node's own python3 on the healthy node and the gpu-lost one (this checkout's
    gpuprov and what it imports copied in: recorded_node.install_gpuprov), as root, the way an
    administrator runs it there; --only gpu is the real H100's own run (pytest -m gpu).
    {node: (exit status, {probe: row})}."""
    out = {}
    for node in ("h100", "h100-gpu-lost"):
        cid = cluster[1][node]
        path = recorded_node.install_gpuprov(cid)
        proc = _docker("exec", "-e", f"PYTHONPATH={path}", cid, "python3", "-m", "gpuprov", "verify", "--local",
                       "--gpus", "1", "--gpu-model", "H100", "--driver", "580", "--only", "gpu", "-o", "json")
        assert proc.returncode in (0, 1), proc.stderr
        assert "expecting 1 x H100 (--gpus, --gpu-model); probes: gpu" in proc.stderr, proc.stderr
        assert "driver 580.159.04 (open module, branch 580)" in proc.stderr, proc.stderr
        hosts = json.loads(proc.stdout)["hosts"]
        assert len(hosts) == 1, hosts  # one node: the machine itself, named by its hostname
        out[node] = (proc.returncode, {r["probe"]: r for r in next(iter(hosts.values()))})
    return out


def test_verify_local_on_the_node_passes_what_the_real_h100_passed(verified_locally) -> None:
    rc, rows = verified_locally["h100"]
    # The real H100's four passes, detail for detail, and the flavour probe written since.
    for probe, detail in _real_passes().items():
        assert rows[probe] == {"probe": probe, "status": "pass", "detail": detail}, rows[probe]
    assert {p for p, r in rows.items() if r["status"] == "pass"} == REAL_PASSES | {
        "running_kernel_module_flavour_matches_the_lock"}
    # The GPU probes of the container stack and DKMS fail, as on the real H100 (no Docker, no
    # module in sysfs): verify --local exits 1 and says why for each.
    fails = {p: r["detail"] for p, r in rows.items() if r["status"] == "fail"}
    assert rc == 1 and set(fails) == {"docker_run_gpus_all_sees_the_gpus", "cuda_base_image_reports_the_locked_cuda",
                                      "cdi_spec_matches_the_driver", "dkms_module_flavour_matches_the_lock"}, fails
    assert "docker: not found" in fails["docker_run_gpus_all_sees_the_gpus"]
    assert "(/sys/module/nvidia/version)" in fails["cdi_spec_matches_the_driver"]


def test_verify_local_on_the_lost_gpu_fails_its_cuda_context(verified_locally) -> None:
    healthy, lost = verified_locally["h100"][1], verified_locally["h100-gpu-lost"][1]
    changed = {p: r for p, r in lost.items() if r != healthy[p]}
    assert changed == {"cuda_context_can_be_created": {
        "probe": "cuda_context_can_be_created", "status": "fail",
        "detail": "expected a CUDA context on GPU 0 (all CUresult 0), found: [999, 3, 3, 3] 0"}}, changed


def test_health_runs_its_gpu_checks_on_the_recordings(cluster, env) -> None:
    proc = run_cli("health", cluster[0], "-o", "json", env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    checks: dict[str, dict[str, dict[str, str]]] = {}
    for c in json.loads(proc.stdout)["checks"]:
        checks.setdefault(c["node"], {})[c["check"]] = c
    healthy = checks["h100"]
    # The GPU checks run on the recorded outputs and pass; the node's kernel log is the host's
    # (container: xid skips), and peermem skips: the recorded machine (a one-GPU VM) has no
    # InfiniBand/RoCE adapter for nvidia-peermem to serve.
    for check in ("gpu_count", "gpu_answers", "driver", "ecc", "row_remap", "clocks", "temperature"):
        assert healthy[check]["status"] == "pass", healthy[check]
    assert healthy["gpu_answers"]["found"] == "1 GPU(s) answer: NVIDIA H100 80GB HBM3"
    assert healthy["temperature"]["found"] == "hottest GPU 33 °C"
    assert healthy["xid"]["status"] == "skip" and "container node" in healthy["xid"]["reason"]
    assert {k for k, c in healthy.items() if c["status"] == "fail"} == set()
    assert healthy["peermem"]["status"] == "skip" and "no InfiniBand/RoCE device" in healthy["peermem"]["reason"]
    failing = {n: sorted(k for k, c in cs.items() if c["status"] == "fail" and k != "peermem")
               for n, cs in checks.items()}
    assert failing == {"h100": [], "h100-proprietary": ["driver"], "h100-gpu-gone": ["gpu_count"],
                       "h100-nvswitch": ["fabricmanager"], "h100-gpu-lost": ["gpu_answers"]}, failing
    lost = checks["h100-gpu-lost"]["gpu_answers"]
    assert "Unable to determine the device handle for GPU0000:00:06.0" in lost["found"], lost


def test_the_fixture_libcuda_answers_only_what_the_recording_holds() -> None:
    healthy = recorded_node.cuda_driver(recorded_node.files_of(BASE))
    assert healthy == "init 0\ndriver_version 13000\ndevice 9 0 NVIDIA H100 80GB HBM3\n"
    lost = recorded_node.cuda_driver(recorded_node.files_of(BASE, "h100-sxm5-580-edited-gpu-lost"))
    assert lost == f"init {recorded_node.CUDA_ERROR_UNKNOWN}\ndriver_version 13000\n"
    h200 = recorded_node.files_of("h200-580")
    assert recorded_node.cuda_driver(h200) == "init 0\ndriver_version 13000\ndevice 9 0 NVIDIA H200\n"
    # Without the recorded CUDA run there is no driver API version to answer with: no libcuda.
    assert recorded_node.cuda_driver({n: t for n, t in h200.items() if not n.startswith("cuda118")}) is None


def test_a_command_without_a_recording_fails_loudly(cluster) -> None:
    cid = cluster[1]["h100"]
    proc = _docker("exec", cid, "nvidia-smi", "topo", "-m", "-i", "0")
    assert proc.returncode == recorded_node.UNANSWERED and not proc.stdout, proc
    assert proc.stderr.startswith(f"FIXTURE nvidia-smi (recording {BASE}): no recording of "
                                  "`nvidia-smi topo -m -i 0`"), proc.stderr
    again = _docker("exec", cid, "nvidia-smi", "-L")
    assert again.returncode == 0 and again.stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3"), again
