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
