"""Slurm's side of `--gpu-sharing` (docs/gpu-sharing.md): slurm.conf's GresTypes and each GPU
node's Gres=, and gres.conf's lines, for a MIG layout (GRES gpu typed by MIG profile), shards
and MPS, rendered by the slurm role's own rules (roles/slurm/filter_plugins/gpuprov_slurm.py,
through gpuprov.slurm.conf) on the recorded H100 and the catalog's 8-GPU p5, with the layouts'
instances from gpuprov's data files."""

from __future__ import annotations

import re

import pytest

from gpuprov.errors import BadInput
from gpuprov.sharing import choice, layouts
from gpuprov.slurm import conf
from tests.unit.test_slurm_conf import cluster, h100, local, node_line, p5


def _layout(value: str, itype: str = "p5.48xlarge") -> dict[str, int]:
    from gpuprov import catalog

    return layouts.role_inputs(choice.parse(value), catalog.find(itype), None)["instances"]


def _gres(text: str) -> list[str]:
    return text.splitlines()[1:]


def test_a_mig_layout_is_its_instances_typed_by_profile() -> None:
    balanced = cluster(p5(), h100(), local(), gpu_sharing="mig:all-balanced", gpu_sharing_instances=_layout(
        "mig:all-balanced"))
    text = conf.slurm_conf(balanced)
    assert "GresTypes=gpu" in text.splitlines()
    # 8 GPUs x (2 x 1g.10gb + 2g.20gb + 3g.40gb); the recorded H100 VM has one GPU.
    assert " Gres=gpu:1g.10gb:16,gpu:2g.20gb:8,gpu:3g.40gb:8 " in node_line(text, "p5-1")
    assert " Gres=gpu:1g.10gb:2,gpu:2g.20gb:1,gpu:3g.40gb:1 " in node_line(text, "h100-1")
    assert " Gres=" not in node_line(text, "demo-1")
    # Without Slurm's NVML plugin (Debian 12): each profile's count, no device files.
    assert _gres(conf.gres_conf(balanced)) == [
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=1g.10gb Count=16",
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=2g.20gb Count=8",
        "NodeName=p5-1 AutoDetect=off Name=gpu Type=3g.40gb Count=8",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=1g.10gb Count=2",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=2g.20gb Count=1",
        "NodeName=h100-1 AutoDetect=off Name=gpu Type=3g.40gb Count=1",
    ]
    # With it: NVML finds the MIG devices and their types.
    seven = cluster(h100(nvml=True), gpu_sharing="mig:all-1g.10gb", gpu_sharing_instances=_layout("mig:all-1g.10gb"))
    assert " Gres=gpu:1g.10gb:7 " in node_line(conf.slurm_conf(seven), "h100-1")
    assert _gres(conf.gres_conf(seven)) == ["NodeName=h100-1 AutoDetect=nvml"]


def test_shards_and_mps_are_counted_per_gpu_beside_the_whole_gpus() -> None:
    shards = cluster(p5(), local(), gpu_sharing="shard:4")
    text = conf.slurm_conf(shards)
    assert "GresTypes=gpu,shard" in text.splitlines()
    assert " Gres=gpu:h100:8,shard:32 " in node_line(text, "p5-1")
    assert _gres(conf.gres_conf(shards)) == ["NodeName=p5-1 AutoDetect=off Name=gpu Type=h100 File=/dev/nvidia[0-7]",
                                             "NodeName=p5-1 Name=shard Count=32"]
    mps = cluster(h100(nvml=True), gpu_sharing="mps")
    assert "GresTypes=gpu,mps" in conf.slurm_conf(mps).splitlines()
    assert " Gres=gpu:h100:1,mps:100 " in node_line(conf.slurm_conf(mps), "h100-1")
    assert _gres(conf.gres_conf(mps)) == ["NodeName=h100-1 AutoDetect=nvml", "NodeName=h100-1 Name=mps Count=100"]


def test_no_sharing_is_the_whole_gpus_as_before() -> None:
    assert conf.slurm_conf(cluster(p5(), gpu_sharing="none")) == conf.slurm_conf(cluster(p5()))
    assert conf.gres_conf(cluster(p5(), gpu_sharing="none")) == conf.gres_conf(cluster(p5()))


def test_a_layout_without_its_instances_stops_on_a_gpu_node_only() -> None:
    assert conf.gres_conf(cluster(local(), gpu_sharing="mig:all-1g.10gb")).splitlines()[1:] == []
    with pytest.raises(BadInput, match=re.escape("node p5-1: gpu_sharing mig:all-1g.10gb: the layout's instances")):
        conf.slurm_conf(cluster(p5(), gpu_sharing="mig:all-1g.10gb"))


@pytest.mark.parametrize(("sharing", "instances", "said"), [
    ("mig:all-1g.10gb\nGresTypes=x", {"1g.10gb": 7}, "expected mig:LAYOUT, mps, shard:N or none"),
    ("shard:1", {}, "from 2 to 64"),
    ("shard:65", {}, "from 2 to 64"),
    ("mig:all-1g.10gb.me", {"1g.10gb+me": 1}, "a +me profile is no Slurm GRES type"),
    ("mig:x", {"1g.10gb File=/etc/shadow": 1}, "a MIG profile such as 1g.10gb"),
    ("mig:x", {"1g.10gb": 8}, "from 1 to 7"),
])
def test_a_value_that_could_add_a_line_or_a_parameter_is_refused(sharing: str, instances: dict, said: str) -> None:
    with pytest.raises(BadInput, match="gpu_sharing") as exc:
        conf.gres_conf(cluster(p5(), gpu_sharing=sharing, gpu_sharing_instances=instances))
    assert said in str(exc.value)
