from __future__ import annotations

import pytest

from gpuprov import catalog
from gpuprov.errors import BadInput


def test_known_type_has_gpu_facts() -> None:
    p4d = catalog.get("p4d.24xlarge")
    assert (p4d.gpu_model, p4d.gpu_count, p4d.arch, p4d.nvswitch) == ("A100", 8, "sm_80", True)
    assert p4d.efa and p4d.efa_max_interfaces == 4


def test_docker_node_expects_no_gpu() -> None:
    node = catalog.get("docker-node")
    assert node.gpu_count == 0 and node.virtualization == "container"


def test_unknown_type_suggests_close_names() -> None:
    with pytest.raises(BadInput, match=r"did you mean p4d\.24xlarge"):
        catalog.get("p4d.24xl")


def test_filter_by_gpu_is_case_insensitive() -> None:
    names = {t.name for t in catalog.by_gpu("h100")}
    assert names == {"p5.48xlarge", "dgx-h100", "hgx-h100-8gpu"}


def test_h200_and_b200_types() -> None:
    # DescribeInstanceTypes-derived facts (gpuprov/catalog/instance_types.json's _about).
    for name, efa in (("p5e.48xlarge", 32), ("p5en.48xlarge", 16)):
        t = catalog.get(name)
        assert (t.gpu_model, t.gpu_count, t.gpu_memory_gib, t.arch, t.vcpus, t.memory_gib) == (
            "H200", 8, 141, "sm_90", 192, 2048)
        assert t.nvswitch and t.efa and t.efa_max_interfaces == efa
    b200 = catalog.get("p6-b200.48xlarge")
    assert (b200.gpu_model, b200.gpu_count, b200.arch, b200.nvswitch, b200.efa) == (
        "B200", 8, "sm_100", True, True)
    assert catalog.family("p6-b200.48xlarge") in catalog.NVSWITCH_FAMILIES
    assert catalog.ARCH_BY_GPU["B200"] == "sm_100"
    assert {t.name for t in catalog.by_gpu("b200")} == {"p6-b200.48xlarge"}


def test_b200_from_the_api_keeps_nvswitch_and_arch() -> None:
    record = {"InstanceType": "p6-b200.48xlarge",
              "GpuInfo": {"Gpus": [{"Name": "B200", "Count": 8, "MemoryInfo": {"SizeInMiB": 183359}}]},
              "VCpuInfo": {"DefaultVCpus": 192}, "MemoryInfo": {"SizeInMiB": 2097152},
              "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 8},
                              "MaximumNetworkCards": 8}}
    t = catalog.from_api(record, "us-east-1")
    assert (t.arch, t.nvswitch, t.gpu_memory_gib, t.efa_max_interfaces) == ("sm_100", True, 179, 8)


def test_an_arm64_type_from_ec2_is_refused_with_its_reason_not_a_crash() -> None:
    """g5g (T4g, Graviton) as DescribeInstanceTypes describes it, after `types --refresh`: the
    lock refuses it, exit 2 with the reason, instead of dying on a KeyError."""
    from gpuprov.errors import BadInput
    from gpuprov.lock import stack

    record = {"InstanceType": "g5g.xlarge", "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
              "VCpuInfo": {"DefaultVCpus": 4}, "MemoryInfo": {"SizeInMiB": 8192},
              "GpuInfo": {"Gpus": [{"Name": "T4g", "Manufacturer": "NVIDIA", "Count": 1,
                                    "MemoryInfo": {"SizeInMiB": 15360}}]},
              "NetworkInfo": {"EfaSupported": False, "MaximumNetworkCards": 1}}
    itype = catalog.from_api(record, "us-east-1")
    assert itype.cpu_arch == "arm64"
    with pytest.raises(BadInput, match=r"g5g\.xlarge is an arm64 type: gpuprov pins x86_64 packages only"):
        stack.resolve_types([itype])
    x86 = catalog.from_api({**record, "InstanceType": "g9x.xlarge",
                            "ProcessorInfo": {"SupportedArchitectures": ["x86_64", "i386"]}}, "us-east-1")
    assert x86.cpu_arch == "x86_64"
    with pytest.raises(BadInput, match=r"no driver facts for T4g \(g9x\.xlarge\)"):
        stack.resolve_types([x86])
