"""Dynamic nodes in slurm.conf (the slurm role's filter plugin, through gpuprov.slurm.conf):
State=CLOUD node lines, Slurm's power saving parameters and the lines that depend on the Slurm
release, checked against what Debian 12's slurmctld 22.05.8 did with them (recorded in
tests/fixtures/recordings/slurm-22.05-debian12, README there). Then the refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuprov.errors import BadInput
from gpuprov.slurm import conf
from gpuprov.slurm.conf import SlurmCluster, SlurmNode, SlurmPower

REC = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "slurm-22.05-debian12"
RELEASE_22 = (REC / "sinfo-version.txt").read_text()  # "slurm-wlm 22.05.8"


def p4d(name: str) -> SlurmNode:
    """A p4d.24xlarge as the catalog has it (96 vCPUs on 2 sockets, 8 A100s, 1152 GiB)."""
    return SlurmNode(name=name, cpus=96, sockets=2, cores_per_socket=24, threads_per_core=2,
                     memtotal_mb=1152 * 1024, gpus=8, gpu_model="A100", partition="p4d.24xlarge")


def node_line(text: str, name: str) -> str:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"NodeName={name} ")]
    return line


def power(version: str = RELEASE_22, **kw) -> SlurmPower:
    return SlurmPower(suspend_time=kw.pop("suspend_time", 600), resume_program="/usr/local/sbin/gpuprov-resume",
                      suspend_program="/usr/local/sbin/gpuprov-suspend",
                      resume_fail_program="/usr/local/sbin/gpuprov-resume-failed", slurm_version=version, **kw)


def dynamic(name: str) -> SlurmNode:
    return dataclasses.replace(p4d(name), addr="")


def elastic(static: int = 1, dynamics: int = 2, **kw) -> SlurmCluster:
    nodes = tuple(p4d(f"train-st-{i}") for i in range(1, static + 1))
    return SlurmCluster(cluster_name="train", controller="train-st-1", nodes=nodes,
                        dynamic_nodes=tuple(dynamic(f"train-dy-{i}") for i in range(1, dynamics + 1)),
                        power=kw.pop("power", power()), **kw)


def keys(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith(("#", "NodeName", "PartitionName")))


# -- the release ------------------------------------------------------------------------------
def test_the_release_is_read_from_sinfo_or_from_apts_record() -> None:
    assert conf.slurm_version(RELEASE_22) == (22, 5)
    apt = (REC / "apt-cache-show.txt").read_text()
    assert conf.apt_version(apt, "slurm-client") == "22.05.8-4+deb12u3"
    assert conf.slurm_version(conf.apt_version(apt, "slurm-client")) == (22, 5)
    assert conf.apt_version(apt, "munge") == "0.5.15-2+deb12u1"  # a stanza of its own, not slurm's
    assert conf.apt_version(apt, "slurm-wlm-nvml-plugin") == ""
    assert conf.slurm_version("24.11.5-4+deb13u1") == (24, 11)


# -- the lines --------------------------------------------------------------------------------
def test_dynamic_nodes_are_cloud_nodes_without_an_address_in_every_partition() -> None:
    text = conf.slurm_conf(elastic())
    assert node_line(text, "train-st-1").endswith("State=UNKNOWN")
    for name in ("train-dy-1", "train-dy-2"):
        line = node_line(text, name)
        assert line.endswith("State=CLOUD") and "NodeAddr=" not in line
        assert "Gres=gpu:a100:8" in line  # the same resources as a static node of the type
    partitions = [ln for ln in text.splitlines() if ln.startswith("PartitionName=")]
    assert all("Nodes=train-st-1,train-dy-1,train-dy-2 " in ln for ln in partitions), partitions
    gres = conf.gres_conf(elastic())
    assert "NodeName=train-dy-2 AutoDetect=off Name=gpu Type=a100 File=/dev/nvidia[0-7]" in gres
    # A dynamic node has no address until it registers: nothing in /etc/hosts names it.
    assert "train-dy" not in conf.hosts_entries(dataclasses.replace(
        elastic(), nodes=(dataclasses.replace(p4d("train-st-1"), addr="10.0.0.5"),)))


def test_power_saving_on_22_05_as_slurmctld_22_05_8_took_it() -> None:
    found = keys(conf.slurm_conf(elastic()))
    assert {k: found[k] for k in ("SuspendTime", "SuspendTimeout", "ResumeTimeout", "ResumeProgram", "SuspendProgram",
                                  "ResumeFailProgram", "SlurmctldParameters", "TreeWidth", "SuspendExcNodes")} == {
        "SuspendTime": "600", "SuspendTimeout": "120", "ResumeTimeout": "600",
        "ResumeProgram": "/usr/local/sbin/gpuprov-resume", "SuspendProgram": "/usr/local/sbin/gpuprov-suspend",
        "ResumeFailProgram": "/usr/local/sbin/gpuprov-resume-failed",
        "SlurmctldParameters": "enable_configless,idle_on_node_suspend,cloud_reg_addrs", "TreeWidth": "65533",
        "SuspendExcNodes": "train-st-1"}
    # 22.05 hides powered-down cloud nodes from sinfo without PrivateData=cloud, and refuses
    # KeepPowerSaveSettings (both seen on slurmctld 22.05.8: the recordings).
    assert found["PrivateData"] == "cloud"
    assert "ReconfigFlags" not in found
    assert "Invalid ReconfigFlag: KeepPowerSaveSettings" in (REC / "keep-power-save-settings.txt").read_text()
    shown = (REC / "sinfo-cloud-nodes.txt").read_text()
    assert "PrivateData=cloud" in shown and "train" not in shown  # the recording's own cluster, "try"
    assert "try-dy-1 idle~" in shown and "try-dy-1" not in (REC / "sinfo-without-private-data.txt").read_text()


def test_slurmctld_ran_each_program_with_a_hostlist_as_the_lines_name_them() -> None:
    """The recorded run: a job resumed both dynamic nodes at once, none registered within
    ResumeTimeout (300 s there), so the fail program ran; a forced power-down ran suspend."""
    calls = [line.split(" ", 2) for line in (REC / "power-programs.log").read_text().splitlines()]
    assert [(what, hosts) for _, what, hosts in calls] == [
        ("resume", "try-dy-[1-2]"), ("fail", "try-dy-[1-2]"), ("suspend", "try-dy-[1-2]")]
    assert 300 <= int(calls[1][0]) - int(calls[0][0]) <= 310


def test_power_saving_from_23_02_keeps_its_settings_across_a_reconfigure() -> None:
    found = keys(conf.slurm_conf(elastic(power=power("24.11.5-4+deb13u1"))))
    assert found["ReconfigFlags"] == "KeepPowerSaveSettings"
    assert "PrivateData" not in found  # cloud nodes are shown by default from 23.02


def test_a_cluster_of_dynamic_nodes_alone_excludes_none_and_a_static_one_has_no_power_lines() -> None:
    found = keys(conf.slurm_conf(elastic(static=0)))
    assert "SuspendExcNodes" not in found and found["SuspendTime"] == "600"
    static_only = conf.slurm_conf(dataclasses.replace(elastic(), dynamic_nodes=(), power=None))
    assert not {"SuspendTime", "ResumeProgram", "TreeWidth", "PrivateData"} & set(keys(static_only))


# -- the refusals -------------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "words"), [
    ({"power": None}, "dynamic nodes need power settings"),
    ({"dynamic_nodes": ()}, "power settings without a dynamic node"),
    ({"dynamic_nodes": (dataclasses.replace(p4d("train-dy-1"), addr="10.0.0.9"),)}, "dynamic node train-dy-1: no addr"),
    ({"dynamic_nodes": (dynamic("train-st-1"),)}, "node train-st-1 is listed twice"),
    ({"power": power(suspend_time=0)}, "power suspend_time"),
    ({"power": power(resume_timeout=10)}, "power resume_timeout"),
    ({"power": power("")}, "slurm_version ''"),
    ({"power": power("unknown")}, "slurm_version 'unknown'"),
    ({"power": dataclasses.replace(power(), resume_program="/usr/local/sbin/resume\nSlurmUser=root")},
     "power resume_program"),
    ({"power": dataclasses.replace(power(), suspend_program="relative/suspend")}, "power suspend_program"),
    ({"power": dataclasses.replace(power(), resume_fail_program="/bin/sh -c reboot")}, "power resume_fail_program"),
])
def test_refused_with_what_is_wrong(change: dict, words: str) -> None:
    with pytest.raises(BadInput, match=r"^slurm: ") as caught:
        conf.slurm_conf(dataclasses.replace(elastic(), **change))
    assert words in str(caught.value)


def test_a_dynamic_node_like_a_host_of_the_play_has_its_resources_and_no_address() -> None:
    rules = conf.rules()
    host = {"__slurm_node": {**vars(p4d("train-st-1")), "addr": "10.0.0.5"}}
    entries = rules.dynamic_entries([{"name": "train-dy-1", "like": "st1"}, vars(dynamic("train-dy-2"))],
                                    {"st1": host, "st2": {}})
    assert entries[0] == {**host["__slurm_node"], "name": "train-dy-1", "addr": ""}
    assert entries[1]["name"] == "train-dy-2"
    for like in ("st2", "nowhere", 5):
        with pytest.raises(rules.SlurmConfError, match="is no compute host of the play"):
            rules.dynamic_entries([{"name": "train-dy-1", "like": like}], {"st1": host, "st2": {}})
