"""The gpu_sharing role on a recorded H100 (the FIXTURE nvidia-smi of prepare.yml): the steps it
took, in order, once; what the GPU holds after; the units; and what the program would plan next."""

import json

LOG = "/var/lib/gpuprov-fixture/calls.log"
PROGRAM = "/usr/local/sbin/gpuprov-gpu-sharing"
ASKED = "--sharing mig:all-1g.10gb --instance=1g.10gb=7 --client=slurmd --driver-client=nvidia-persistenced"


def _plan(host, args: str) -> dict:
    out = host.run(f"{PROGRAM} plan {args} --json")
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def test_the_steps_ran_once_in_order_and_a_second_run_planned_nothing(host):
    # The converge applied them; the idempotence run and --check added nothing (the clients'
    # stops and starts are the FIXTURE units', the rest the FIXTURE nvidia-smi's).
    calls = host.file(LOG).content_string.splitlines()
    assert calls == [
        "systemctl stop slurmd",
        "systemctl stop nvidia-persistenced",
        "nvidia-smi -i 0 -mig 1",
        "nvidia-smi --gpu-reset -i 0",
        "nvidia-smi mig -i 0 -cgi " + ",".join(["1g.10gb"] * 7) + " -C",
        "systemctl start nvidia-persistenced",
        "systemctl start slurmd",
    ], calls


def test_the_gpu_holds_the_layout(host):
    modes = host.check_output("nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader")
    assert modes.strip() == "0, Enabled, Enabled"
    rows = [line for line in host.check_output("nvidia-smi mig -lgi").splitlines() if "MIG 1g.10gb" in line]
    assert len(rows) == 7, rows
    assert _plan(host, ASKED)["steps"] == []


def test_the_clients_run_again(host):
    for name in ("slurmd", "nvidia-persistenced"):
        assert host.service(name).is_running, f"{name} (FIXTURE) is not running after the role"


def test_the_boot_unit_is_enabled_for_mig_and_mps_is_not(host):
    boot = host.service("gpuprov-gpu-sharing")
    assert boot.is_enabled and boot.is_running, "the boot unit is enabled and started (its run: a no-op)"
    unit = host.file("/etc/systemd/system/gpuprov-gpu-sharing.service").content_string
    assert "Before=slurmd.service nvidia-dcgm.service" in unit and f"apply {ASKED}" in unit
    assert not host.service("gpuprov-mps-control").is_enabled


def test_leaving_mig_would_destroy_reset_and_stop_the_driver_clients(host):
    plan = _plan(host, "--sharing mps --client slurmd --driver-client nvidia-persistenced")
    assert [s["command"] for s in plan["steps"]] == [
        "systemctl stop slurmd", "systemctl stop nvidia-persistenced",
        "nvidia-smi mig -i 0 -dci", "nvidia-smi mig -i 0 -dgi", "nvidia-smi -i 0 -mig 0", "nvidia-smi --gpu-reset -i 0",
        "systemctl start nvidia-persistenced", "systemctl start slurmd"]
    assert host.file(LOG).content_string.count("\n") == 7, "plan changed something"


def test_a_value_of_another_form_is_refused_before_anything_runs(host):
    out = host.run(f"{PROGRAM} apply --sharing 'mig:all;reboot' --instance 1g.10gb=7")
    assert out.rc == 2 and "expected mig:LAYOUT" in out.stderr
    out = host.run(f"{PROGRAM} apply --sharing mig:all-1g.10gb --instance '1g.10gb -dgi=7'")
    assert out.rc == 2


def test_without_nvidia_smi_the_program_says_so(host):
    plan = _plan(host, "--sharing mps --nvidia-smi /usr/bin/nvidia-smi-absent")
    assert plan["gpus"] == 0 and "no NVIDIA driver" in plan["no_gpu"] and plan["steps"] == []
