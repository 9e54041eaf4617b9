"""Selection by need and budget: `gpuprov types`' filters, sorts and --for rules, and the
choices `up --max-price` ranks (pure: no AWS, prices from ``gpuprov.pricing.prices``).

The --for rules (docs/cost.md):
- training: types with GPUs; NVSwitch (all-to-all NVLink) first, then EFA, then the price per
  GPU-hour; multi-node data parallelism is bound by the GPU-to-GPU and node-to-node fabric.
- inference: types whose GPU memory fits --min-gpu-mem (per GPU), the cheapest instance first;
  a model that fits one GPU gains nothing from NVLink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuprov.catalog import InstanceType
from gpuprov.errors import BadInput
from gpuprov.pricing import PURPOSES, SORTS, prices
from gpuprov.pricing.prices import Price


@dataclass(frozen=True)
class Need:
    """What `types` (and `up --max-price`) was asked for; None/False: not asked."""

    gpu: str | None = None
    gpus: int | None = None  # at least
    min_gpu_mem: int | None = None  # GiB per GPU, at least
    max_price: float | None = None  # USD per instance-hour, at most
    spot: bool = False
    efa: bool = False
    nvswitch: bool = False
    cuda: str | None = None  # a CUDA line the GPUs must run
    purpose: str | None = None  # training | inference
    sort: str | None = None  # gpu-price (default) | price | gpus

    def check(self) -> Need:
        """Refuse values no type can meet for a reason of their own (one line, exit 2)."""
        if self.gpus is not None and self.gpus < 1:
            raise BadInput(f"--gpus {self.gpus}: expected at least 1")
        if self.min_gpu_mem is not None and self.min_gpu_mem < 1:
            raise BadInput(f"--min-gpu-mem {self.min_gpu_mem}: expected GiB per GPU, at least 1")
        if self.max_price is not None and not (self.max_price > 0 and math.isfinite(self.max_price)):
            raise BadInput(f"--max-price {self.max_price}: expected US dollars per instance-hour, more than 0")
        if self.purpose is not None and self.purpose not in PURPOSES:
            raise BadInput(f"--for {self.purpose}: expected one of {', '.join(PURPOSES)}")
        if self.sort is not None and self.sort not in SORTS:
            raise BadInput(f"--sort {self.sort}: expected one of {', '.join(SORTS)}")
        if self.purpose and self.sort:
            raise BadInput(f"--sort and --for {self.purpose} both order the list: give one")
        return self


@dataclass(frozen=True)
class Offer:
    """A type that meets the need, its price here (None: unknown) and why it is in the list."""

    itype: InstanceType
    price: Price | None
    why: list[str] = field(default_factory=list)

    @property
    def per_gpu(self) -> float | None:
        if self.price is None or not self.itype.gpu_count:
            return None
        return self.price.usd_per_hour / self.itype.gpu_count


def _cuda_line(value: str) -> str:
    from gpuprov import cuda_lines  # lazy: CLI start-up

    line = cuda_lines.spelled(value)
    if line not in cuda_lines.lines():
        raise BadInput(f"--cuda {value}: gpuprov knows CUDA lines {cuda_lines.listing()}")
    if cuda_lines.os_only(line):
        raise BadInput(f"--cuda {value}: CUDA {line} is {', '.join(cuda_lines.os_only(line))}'s own line "
                       f"(`gpuprov stack --os {cuda_lines.os_only(line)[0]} --source distro`), not a type's; types "
                       f"lists the lines of every OS: {', '.join(cuda_lines.lines_for_arch(None))}")
    return line


def offers(types: list[InstanceType], region: str, need: Need) -> tuple[list[Offer], list[str]]:
    """The types that meet ``need``, priced in ``region`` and ordered; and notes on what was
    left out for want of a price."""
    from gpuprov import cuda_lines  # lazy: CLI start-up

    line = _cuda_line(need.cuda) if need.cuda else None
    want_gpu = need.gpu.lower() if need.gpu else None
    kept: list[Offer] = []
    unpriced: list[str] = []
    for t in types:
        if want_gpu and (t.gpu_model or "").lower() != want_gpu:
            continue
        if (need.gpus and t.gpu_count < need.gpus) or (need.purpose and not t.gpu_count):
            continue
        if need.min_gpu_mem and t.gpu_memory_gib < need.min_gpu_mem:
            continue
        if (need.efa and not t.efa) or (need.nvswitch and not t.nvswitch):
            continue
        if line and line not in cuda_lines.lines_for_arch(t.arch):
            continue
        price = prices.price(t, region, spot_price=need.spot)
        if need.max_price is not None:
            if price is None:
                if t.provider == "aws":  # on-prem and local machines have no price: not news
                    unpriced.append(t.name)
                continue
            if price.usd_per_hour > need.max_price:
                continue
        kept.append(Offer(t, price, _why(t, price, need, line)))
    notes = []
    if unpriced:
        notes.append(f"left out, no {'spot' if need.spot else 'on-demand'} price known in {region}: "
                     + ", ".join(sorted(unpriced)))
    return _ordered(kept, need), notes


def _why(t: InstanceType, price: Price | None, need: Need, line: str | None) -> list[str]:
    why = []
    if need.gpus:
        why.append(f"{t.gpu_count} GPUs >= {need.gpus}")
    if need.min_gpu_mem:
        why.append(f"{t.gpu_memory_gib} GiB/GPU >= {need.min_gpu_mem}")
    if need.purpose == "training":
        why.append("NVSwitch: all-to-all NVLink" if t.nvswitch else "no NVSwitch")
        why.append(f"EFA x{t.efa_max_interfaces}" if t.efa else "no EFA")
    if line:
        why.append(f"{t.arch} runs CUDA {line}")
    if need.max_price is not None and price is not None:
        why.append(f"${prices.usd(price.usd_per_hour)}/h <= ${prices.usd(need.max_price)}")
    return why


def _ordered(kept: list[Offer], need: Need) -> list[Offer]:
    inf = float("inf")

    def money(o: Offer) -> float:
        return o.price.usd_per_hour if o.price else inf

    def per_gpu(o: Offer) -> float:
        return o.per_gpu if o.per_gpu is not None else inf

    if need.purpose == "training":
        ordered = sorted(kept, key=lambda o: (not o.itype.nvswitch, not o.itype.efa, per_gpu(o), o.itype.name))
        if ordered:  # the rule once, on the first row; every row says where it stands
            ordered[0] = _note(ordered[0], "training: NVSwitch and EFA first, then $/GPU-hour")
        return ordered
    if need.purpose == "inference":
        ordered = sorted(kept, key=lambda o: (money(o), o.itype.name))
        if ordered and ordered[0].price is not None:
            ordered[0] = _note(ordered[0], "inference: the cheapest instance whose GPU memory fits")
        return ordered
    sort = need.sort or "gpu-price"
    if sort == "price":
        return sorted(kept, key=lambda o: (money(o), o.itype.name))
    if sort == "gpus":
        return sorted(kept, key=lambda o: (-o.itype.gpu_count, per_gpu(o), o.itype.name))
    return sorted(kept, key=lambda o: (per_gpu(o), o.itype.provider, o.itype.name))


def _note(offer: Offer, rule: str) -> Offer:
    return Offer(offer.itype, offer.price, [rule, *offer.why])


def cheapest_over(types: list[InstanceType], region: str, need: Need) -> Offer | None:
    """The cheapest priced type that meets every need but the budget (for the refusal's words)."""
    unbounded = Need(**{**need.__dict__, "max_price": None, "purpose": None, "sort": "price"})
    found, _ = offers(types, region, unbounded)
    return next((o for o in found if o.price is not None), None)
