"""What the mapping gave the roles' variables on the node, against the lock gpuprov resolved
for it (written by the scenario's converge), and that a play without the role sees none of it."""

import json


def test_the_mapping_gives_the_roles_the_locks_values(host) -> None:
    got = json.loads(host.file("/var/lib/gpuprov-molecule-lock.json").content_string)
    lock = got.pop("lock")
    packages = lock["packages"]
    assert got == {
        "nvidia_driver_version": lock["driver"],
        "nvidia_driver_packages": packages["driver"],
        "cuda_version": lock["cuda"],
        "cuda_package": packages["cuda"],
        "cudnn_version": lock["cudnn"],
        "cudnn_prefix": f"/usr/local/cuda-{lock['cuda']}",
        "container_runtime_toolkit_version": lock["container_toolkit"],
        "base_images_pull": [ref for ref in lock["base_images"] if "@sha256:" in ref],
        "microcode_amd_version": lock["microcode"]["amd"],
    }
    assert lock["driver"] and lock["cuda"] and packages["driver"]  # a real lock, not an empty one


def test_a_play_without_the_role_sees_none_of_the_mapping(host) -> None:
    assert json.loads(host.file("/var/lib/gpuprov-molecule-alone.json").content_string) == []
