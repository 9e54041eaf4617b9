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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuprov.catalog import InstanceType
from gpuprov.errors import BadInput
from gpuprov.pricing import PURPOSES, SORTS, prices
from gpuprov.pricing.prices import Price
from gpuprov.providers import having


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
    from gpuprov.lock import cuda_lines  # lazy: CLI start-up

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
    from gpuprov.lock import cuda_lines  # lazy: CLI start-up

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
                if t.provider in having("priced"):  # on-prem and local machines have no price: not news
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


# -- an empty answer, explained (`types` exits 2 with it) ---------------------------------------
@dataclass(frozen=True)
class _Filter:
    """One filter a list can come back empty for: the Need field, what it asks in words, and of
    the type that misses it, how far it is (the smallest key is the closest) and what it has
    (the words after its name)."""

    field: str
    asks: Callable[[Need, str], str]
    key: Callable[[Offer], float] = lambda o: 0.0
    has: Callable[[Offer], str] = lambda o: ""


def _runs(offer: Offer) -> str:
    from gpuprov.lock import cuda_lines  # lazy: CLI start-up

    return f" ({offer.itype.arch or 'no GPU'}: CUDA {' '.join(cuda_lines.lines_for_arch(offer.itype.arch))})"


_FILTERS = (  # in the order a refusal looks at them
    _Filter("gpus", lambda n, _: f"has at least {n.gpus} GPUs (--gpus {n.gpus})",
            lambda o: -o.itype.gpu_count, lambda o: f" ({o.itype.gpu_count} x {o.itype.gpu_model or 'GPU'})"),
    _Filter("min_gpu_mem", lambda n, _: f"has at least {n.min_gpu_mem} GiB per GPU (--min-gpu-mem {n.min_gpu_mem})",
            lambda o: -o.itype.gpu_memory_gib, lambda o: f" ({o.itype.gpu_memory_gib} GiB per GPU)"),
    _Filter("max_price", lambda n, r: f"costs at most ${n.max_price:.2f}/h {'spot' if n.spot else 'on-demand'} in {r}",
            lambda o: o.price.usd_per_hour if o.price else math.inf,
            lambda o: f" at ${o.price.usd_per_hour:.2f}/h ({o.price.words()})" if o.price else ""),
    _Filter("nvswitch", lambda n, _: "has NVSwitch (--nvswitch)", has=lambda o: " (no NVSwitch)"),
    _Filter("efa", lambda n, _: "has EFA (--efa)", has=lambda o: " (no EFA)"),
    _Filter("cuda", lambda n, _: f"runs CUDA {n.cuda} (--cuda {n.cuda})", has=_runs),
    _Filter("gpu", lambda n, _: f"has {n.gpu} GPUs (--gpu {n.gpu})",
            has=lambda o: f" ({o.itype.gpu_model or 'no GPU'})"),
)


def unanswered(types: list[InstanceType], region: str, need: Need, found: list[Offer]) -> str | None:
    """Why ``found`` (the offers of ``need``) answers nothing, in one line; None where it
    answers. A --spot list without a spot price says where one comes from; an empty list names
    the filter that empties it and the type closest to it that meets the rest."""
    if need.spot and not any(o.price for o in offers(types, region, replace(need, max_price=None))[0]):
        return (f"no spot price known in {region}: the bundled table carries on-demand prices only (spot "
                "prices move by zone and hour, and EC2's spot price history has them); `gpuprov types --spot "
                f"--refresh --region {region}` reads them, with AWS credentials; `gpuprov types` shows the "
                "on-demand prices")
    if found:
        return None
    asked = [f for f in _FILTERS if getattr(need, f.field) not in (None, False)]
    bare = _bare(need)
    for f in asked:  # a filter whose want alone empties the list: the others are met
        words = _closest(types, region, need, replace(need, **{f.field: getattr(bare, f.field)}), f)
        if words:
            return words
    for f in asked:  # a filter no type meets even alone
        if not offers(types, region, replace(bare, **{f.field: getattr(need, f.field)}))[0]:
            return _closest(types, region, need, bare, f)
    return "no instance type meets all of: " + "; ".join(f.asks(need, region) for f in asked)


def _bare(need: Need) -> Need:
    """``need`` without its filters: the kind of price and the order alone."""
    return Need(spot=need.spot, purpose=need.purpose, sort=need.sort)


def _closest(types: list[InstanceType], region: str, need: Need, rest: Need, f: _Filter) -> str | None:
    """The refusal naming filter ``f`` and the closest type that meets ``rest``; None where no
    type meets ``rest``."""
    found, _ = offers(types, region, rest)
    if not found:
        return None
    others = rest != _bare(need)
    head = f"no instance type {'that meets the other filters ' if others else ''}{f.asks(need, region)}"
    closest = min(found, key=f.key)  # the first of the list's own order among the closest
    if f.key(closest) == math.inf:
        return f"{head}; none of them has a known price here"
    return f"{head}; the {'cheapest' if f.field == 'max_price' else 'closest'} is {closest.itype.name}{f.has(closest)}"
