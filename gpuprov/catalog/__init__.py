"""Instance-type facts: GPUs, architecture, EFA, NVSwitch, price estimate.

Two sources, merged:

- EC2's DescribeInstanceTypes (GPU model, count and memory, vCPUs, memory,
  EFA support and maximum EFA interfaces, network cards), fetched by the aws
  provider and cached per region in ``$GPUPROV_HOME/catalog/ec2-REGION.json``;
- the bundled table (``instance_types.json``), the reviewed source for what
  that API does not say (NVSwitch / fabric manager, compute capability,
  on-demand price estimate with its date, the vCPU quota code).

API facts win where both have a field. Nothing here talks to AWS: the
provider hands in what it fetched (``record_api_types``).
"""

from __future__ import annotations

import difflib
import json
import os
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput, DamagedFile

_DATA = Path(__file__).with_name("instance_types.json")
CACHE_MAX_AGE_S = 7 * 24 * 3600

# What DescribeInstanceTypes does not say.
ARCH_BY_GPU = {
    "V100": "sm_70",
    "T4": "sm_75",
    "T4G": "sm_75",
    "A100": "sm_80",
    "A10G": "sm_86",
    "L4": "sm_89",
    "L40S": "sm_89",
    "H100": "sm_90",
    "H200": "sm_90",
    "B200": "sm_100",
}
# GPU models by PCI device id (vendor 10de), for hosts that declare nothing: what the
# PCI bus says. Source: the PCI ID Repository (pci-ids.ucw.cz, vendor 10de), and for
# 2330 and 2335 the real H100 and H200 machines recorded in tests/fixtures/recordings/
# (2901: "GB100 [B200]" in the PCI ID Repository).
GPU_BY_PCI_DEVICE = {
    "0x1db1": "V100", "0x1db4": "V100", "0x1db5": "V100", "0x1db6": "V100",
    "0x1eb8": "T4",
    "0x20b0": "A100", "0x20b2": "A100", "0x20b5": "A100", "0x20f1": "A100",
    "0x2237": "A10G",
    "0x27b8": "L4",
    "0x26b9": "L40S",
    "0x2330": "H100", "0x2331": "H100", "0x2321": "H100",
    "0x2335": "H200",
    "0x2901": "B200",
}
# Families whose GPUs sit on NVSwitch: fabric manager must run, matching the driver.
NVSWITCH_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200"})
# vCPU-based EC2 quotas (Service Quotas, service code "ec2"), by family letter.
QUOTAS_ON_DEMAND = {
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
}
QUOTAS_SPOT = {
    "p": ("L-7212CCBC", "All P Spot Instance Requests"),
    "g": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    "vt": ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
QUOTA_STANDARD = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
QUOTA_SPOT_STANDARD = ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests")


@dataclass(frozen=True)
class InstanceType:
    name: str
    provider: str
    gpu_model: str | None
    gpu_count: int
    gpu_memory_gib: int
    arch: str | None
    vcpus: int | None
    memory_gib: int | None
    efa: bool
    efa_max_interfaces: int
    network_cards: int
    nvswitch: bool
    virtualization: str
    quota_code: str | None = None
    price: dict[str, float] = field(default_factory=dict)
    # InfiniBand/RoCE compute fabric (on-prem DGX/HGX): GPUDirect RDMA through nvidia-peermem.
    infiniband: bool = False
    # The CPU architecture (EC2's ProcessorInfo.SupportedArchitectures): x86_64 or arm64.
    cpu_arch: str = "x86_64"
    # Which entry of the bundled table's price_sources the prices come from.
    price_source: str | None = None

    def price_per_hour(self, region: str | None) -> float | None:
        if region is None:
            return None
        return self.price.get(region)

    def row(self) -> dict[str, Any]:
        # Not at the top: the node health bundle (gpuprov.health.node_bundle) carries this module
        # without the lock data, and never asks for a row.
        from gpuprov.lock import cuda_lines  # lazy: CLI start-up

        return {
            "instance_type": self.name,
            "provider": self.provider,
            "gpu": self.gpu_model,
            "gpus": self.gpu_count,
            "gpu_memory_gib": self.gpu_memory_gib,
            "arch": self.arch,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "efa": self.efa,
            "efa_interfaces": self.efa_max_interfaces,
            "nvswitch": self.nvswitch,
            "price_us_east_1": self.price.get("us-east-1"),  # the bundled table's (kept for old readers)
            # The CUDA lines whose architecture range holds the GPUs' (every line without a GPU).
            "cuda_lines": cuda_lines.lines_for_arch(self.arch),
        }


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return dict(json.loads(_DATA.read_text()))


@lru_cache(maxsize=1)
def _load() -> tuple[str, dict[str, InstanceType]]:
    raw = _raw()
    types = {name: InstanceType(name=name, **facts) for name, facts in raw["types"].items()}
    return raw["price_date"], types


def price_date() -> str:
    """The date of the bundled table's prices (each figure's source: ``price_sources``)."""
    return _load()[0]


def price_sources() -> dict[str, Any]:
    """The bundled table's price sources: {key: {"date", "what", ...}}."""
    return {k: v for k, v in _raw()["price_sources"].items() if not k.startswith("_")}


def price_regions() -> list[str]:
    """The regions the bundled table has prices for."""
    return list(_raw()["price_regions"])


def _merged(region: str | None = None) -> dict[str, InstanceType]:
    types = dict(_load()[1])
    for region_name in [region] if region else cached_regions():
        types.update(cached_types(region_name))
    return types


def all_types(region: str | None = None) -> list[InstanceType]:
    """Bundled types plus what EC2 said (cached), for one region or every cached one."""
    return sorted(_merged(region).values(), key=lambda t: (t.provider, t.name))


def suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    return f"; did you mean {', '.join(close)}?" if close else "; `gpuprov types` lists them"


def get(name: str, region: str | None = None) -> InstanceType:
    types = _merged(region)
    try:
        return types[name]
    except KeyError:
        raise BadInput(f"unknown instance type '{name}'{suggest(name, list(types))}") from None


def find(name: str | None) -> InstanceType | None:
    """Like ``get`` but ``None`` for unknown or absent names (static hosts)."""
    if not name:
        return None
    return _merged().get(name)


def by_gpu(model: str | None, region: str | None = None) -> list[InstanceType]:
    types = all_types(region)
    if model is None:
        return types
    want = model.lower()
    return [t for t in types if t.gpu_model and t.gpu_model.lower() == want]


def from_hardware(hardware: dict[str, Any] | None, declared: InstanceType | None = None,
                  gpus: int | None = None) -> InstanceType:
    """What a host is, from what it declared (a type, or a GPU count) and what its PCI bus
    showed (``hardware``: {"gpu_device_ids": [...], "nvswitches": N}, see
    ``parse_pci``). The bus wins where it can only be right: NVSwitch functions on it mean
    fabric manager whatever was declared, and its GPUs name the model a bare count lacks."""
    read = hardware is not None
    hardware = hardware or {}
    ids = list(hardware.get("gpu_device_ids") or [])
    models = sorted({GPU_BY_PCI_DEVICE.get(i, "") for i in ids} - {""})
    seen_model = models[0] if len(models) == 1 else None
    switches = int(hardware.get("nvswitches") or 0)
    if declared is not None:
        if not switches or declared.nvswitch:
            return declared
        return replace(declared, nvswitch=True)
    count = gpus if gpus is not None else len(ids)
    model = seen_model if count else None
    label = (f"{count}x{model or 'GPU'}" if count else "no-gpu") + ("-nvswitch" if switches else "")
    return InstanceType(
        name=f"detected:{label}" if read else f"declared:{label}" if gpus is not None else "undeclared",
        provider="onprem", gpu_model=model, gpu_count=count,
        gpu_memory_gib=0, arch=ARCH_BY_GPU.get(model or ""), vcpus=None, memory_gib=None,
        efa=False, efa_max_interfaces=0, network_cards=1, nvswitch=bool(switches),
        virtualization="unknown",
    )


# One line per NVIDIA PCI function, as a node prints it for gpuprov (the format of the
# recordings' pci.txt): "/sys/bus/pci/devices/ADDR vendor=0x10de device=0x2330 class=0x030200".
PCI_READ = (
    'for d in /sys/bus/pci/devices/*; do v=$(cat "$d/vendor" 2>/dev/null); '
    '[ "$v" = 0x10de ] && echo "$d vendor=$v device=$(cat "$d/device") class=$(cat "$d/class")"; '
    "done; true"
)


def parse_pci(text: str) -> dict[str, Any]:
    """NVIDIA GPUs (display/3D controllers) and NVSwitches (bridge class 0680) in PCI_READ's
    output; any other line is ignored."""
    import re

    gpus: list[str] = []
    switches = 0
    for m in re.finditer(r"vendor=0x10de device=(0x[0-9a-f]{4}) class=(0x[0-9a-f]{6})", text):
        device, cls = m.groups()
        if cls.startswith(("0x0300", "0x0302")):
            gpus.append(device)
        elif cls.startswith("0x0680"):
            switches += 1
    return {"gpu_device_ids": gpus, "nvswitches": switches}


def family(name: str) -> str:
    return name.split(".", 1)[0]


def quota_for(name: str, spot: bool = False) -> tuple[str, str]:
    """(quota code, quota name) of the vCPU quota that a launch of ``name`` counts against."""
    fam = family(name)
    letter = "vt" if fam.startswith("vt") else fam[:1]
    table = QUOTAS_SPOT if spot else QUOTAS_ON_DEMAND
    return table.get(letter, QUOTA_SPOT_STANDARD if spot else QUOTA_STANDARD)


# -- facts from EC2 (DescribeInstanceTypes), cached in the state dir --------------------
class BadRecord(ValueError):
    """A DescribeInstanceTypes record that is not one: the only exception ``from_api`` raises."""


def _part(record: Any, key: str) -> dict[str, Any]:
    value = record.get(key) if isinstance(record, dict) else None
    if value is None or value == []:
        return {}
    if not isinstance(value, dict):
        raise BadRecord(f"{key} is not an object")
    return value


def _count(value: Any, what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise BadRecord(f"{what} is not a count")
    return value


def from_api(record: dict[str, Any], region: str) -> InstanceType:
    """An InstanceType from one DescribeInstanceTypes record, completed with bundled facts."""
    name = record.get("InstanceType") if isinstance(record, dict) else None
    if not isinstance(name, str) or not name:
        raise BadRecord("no InstanceType")
    bundled = _load()[1].get(name)
    gpus = _part(record, "GpuInfo").get("Gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise BadRecord("GpuInfo.Gpus is not a list of objects")
    gpu = gpus[0] if gpus else {}
    model = gpu.get("Name") or (bundled.gpu_model if bundled else None)
    if model is not None and not isinstance(model, str):
        raise BadRecord("a GPU's Name is not text")
    network = _part(record, "NetworkInfo")
    efa = bool(network.get("EfaSupported"))
    arches = _part(record, "ProcessorInfo").get("SupportedArchitectures") or ["x86_64"]
    vcpus = _part(record, "VCpuInfo").get("DefaultVCpus")
    return InstanceType(
        name=name,
        provider="aws",
        gpu_model=model,
        gpu_count=sum(_count(g.get("Count"), "a GPU count") for g in gpus),
        gpu_memory_gib=round(_count(_part(gpu, "MemoryInfo").get("SizeInMiB"), "GPU memory") / 1024),
        arch=ARCH_BY_GPU.get(model or "", bundled.arch if bundled else None),
        vcpus=_count(vcpus, "DefaultVCpus") if vcpus is not None else None,
        memory_gib=round(_count(_part(record, "MemoryInfo").get("SizeInMiB"), "memory") / 1024) or None,
        efa=efa,
        efa_max_interfaces=(_count(_part(network, "EfaInfo").get("MaximumEfaInterfaces"), "EFA interfaces")
                            if efa else 0),
        network_cards=_count(network.get("MaximumNetworkCards"), "network cards") or 1,
        nvswitch=family(name) in NVSWITCH_FAMILIES,
        virtualization="metal" if record.get("BareMetal") else "vm",
        quota_code=quota_for(name)[0],
        price=dict(bundled.price) if bundled else {},
        price_source=bundled.price_source if bundled else None,
        cpu_arch="x86_64" if isinstance(arches, list) and "x86_64" in arches else "arm64",
    )


def cache_dir() -> Path:
    return paths.home() / "catalog"


def _cache_file(region: str) -> Path:
    return cache_dir() / f"ec2-{region}.json"


def cached_regions() -> list[str]:
    directory = cache_dir()
    if not directory.is_dir():
        return []
    return sorted(p.stem.removeprefix("ec2-") for p in directory.glob("ec2-*.json"))


def _read_cache(region: str, *, damaged_ok: bool = False) -> dict[str, Any]:
    """The cache of ``region`` as record_api_types wrote it; none there: no types. Anything
    else (not JSON, an entry or a record of another shape) is DamagedFile, naming the file
    (``damaged_ok``: no types, for the writer, which replaces it)."""
    path = _cache_file(region)
    try:
        text = path.read_text()
    except OSError:
        return {"types": {}}
    try:
        data = json.loads(text)
        types = data.get("types") if isinstance(data, dict) else None
        if not isinstance(types, dict):
            raise BadRecord("no object of types")
        for entry in types.values():
            fetched = entry.get("fetched") if isinstance(entry, dict) else None
            if isinstance(fetched, bool) or not isinstance(fetched, (int, float)):
                raise BadRecord("an entry has no time fetched")
            from_api(entry.get("record"), region)
    except ValueError as exc:
        if damaged_ok:
            return {"types": {}}
        why = str(exc) if isinstance(exc, BadRecord) else "not JSON"
        raise DamagedFile("catalog cache", path, why, f"delete it (`gpuprov types --refresh --region {region}` "
                          "fetches it again)") from None
    return data


def cached_types(region: str, max_age_s: float | None = None) -> dict[str, InstanceType]:
    """What EC2 said about types in ``region`` (only entries younger than ``max_age_s``)."""
    now = time.time()
    return {name: from_api(entry["record"], region) for name, entry in _read_cache(region)["types"].items()
            if max_age_s is None or now - entry["fetched"] <= max_age_s}


def record_api_types(region: str, records: list[dict[str, Any]]) -> list[InstanceType]:
    """Cache DescribeInstanceTypes records for ``region``; returns them as InstanceTypes."""
    data = _read_cache(region, damaged_ok=True)
    now = time.time()
    good = []
    for record in records:
        try:  # a record EC2 sent that is not one is left out: that type is not known from EC2
            good.append(from_api(_jsonable(record), region))
        except BadRecord:
            continue
        data["types"][good[-1].name] = {"fetched": now, "record": _jsonable(record)}
    path = _cache_file(region)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(path)
    return good


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
