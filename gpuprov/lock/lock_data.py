"""The version lock as it is stored and travels: the JSON object of `stack.Lock.as_dict()`.

A cluster's record, a baked image, the pull bundle and the plays' variables hold the lock as
this object, not as the dataclass: a lock stored by an older gpuprov keeps the hash it was
stored with and lacks the fields added since (`gpuprov.settings.complete_lock` fills
them for the plays, what the record has always winning), and a patch moves some of its fields
and hashes the result again (`gpuprov.core.patch_plan.new_lock`). ``LockData`` types that
object for the checker (mypy, in the lint unit): every key a lock can have, and what each
holds. ``total=False``: a stored lock may lack any field added after locks were first stored.
`tests/unit/test_lock_data.py` holds it to the dataclass: the same fields, plus ``hash``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict


class LockData(TypedDict, total=False):
    instance_type: str
    gpu: str | None
    arch: str | None
    nvswitch: bool
    source: str
    driver_branch: str
    driver: str
    fabricmanager: str | None
    cuda: str
    cuda_version: str
    cudnn: str
    cudnn_archive: str
    cudnn_archive_sha256: str
    nccl: str
    efa_installer: str | None
    # Per source and OS: package names and apt versions (the driver's, fabric manager's, the
    # toolkit's, ...) and how they are pinned; read by the roles' variables.
    packages: dict[str, Any]
    notes: Sequence[str]
    efa_installer_sha256: str
    aws_ofi_nccl: str | None
    gdrcopy: str
    gdrcopy_sha256: str
    microcode: dict[str, str]
    container_toolkit: str
    base_images: Sequence[str]
    site_pip_requirements: Sequence[str]
    kernel_module: str
    driver_branch_kind: str
    driver_eol: str
    dcgm: str | None
    dcgm_package: str
    dcgm_package_version: str
    dcgm_exporter_image: str
    nccl_tests: str | None
    nccl_tests_sha256: str
    cuda_archives: Sequence[dict[str, str]]
    os: str
    # `--gpu-sharing` as recorded: "mig:LAYOUT", "mps", "shard:N"; "" (or absent) for none.
    gpu_sharing: str
    # Not a field of the dataclass: its short hash, as stored (a stored lock keeps its own).
    hash: str
