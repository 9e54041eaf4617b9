"""What `gpuprov up` asks of a provider, typed and frozen: the request (ClusterSpec), each
provider's own options (a ProviderOptions subclass in its light ``options`` module), and the
registry that names the providers and finds their options without loading their SDKs."""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from gpuprov import defaults
from gpuprov.errors import BadInput
from gpuprov.lock.stack_choice import StackChoice
from gpuprov.slurm.scheduler_choice import Scheduler


@dataclass(frozen=True)
class ProviderFacts:
    """What gpuprov knows of a provider without loading it (the CLI starts in well under 100 ms):
    the facts every CLI choice, table, inventory and price rule asks of a provider, declared with
    it in the registry. ``module``: the provider's package (its ``PROVIDER``, and its light
    ``options``). ``images``: it bakes and boots images (`gpuprov image --provider`). ``regions``:
    its clusters live in regions (``--region``, ``--copy-to``). ``priced``: its nodes cost money by
    the hour (prices, `--max-price`, cost rows); else ``no_price`` says why there is none.
    ``package_source``: the NVIDIA stack's source without ``--source``. ``root_free_gib``: the free
    space the preflight asks of its nodes, where not the role's default. ``bake_type``: the type
    `image bake --provider NAME` bootstraps without ``--type``."""

    module: str
    images: bool = False
    regions: bool = False
    priced: bool = False
    no_price: str = ""
    package_source: str = defaults.DEFAULT_SOURCE
    root_free_gib: int | None = None
    bake_type: str | None = None


# The registry: the one place that names the providers and declares what the rest of gpuprov
# asks of them (the CLI's --provider choices too).
PROVIDERS: dict[str, ProviderFacts] = {
    "aws": ProviderFacts("gpuprov.providers.aws", images=True, regions=True, priced=True),
    "docker": ProviderFacts("gpuprov.providers.docker", images=True,
                            no_price="local containers on this machine: no cloud bill",
                            package_source=defaults.LOCAL_SOURCE, root_free_gib=defaults.LOCAL_NODE_FREE_GIB,
                            bake_type="docker-node"),
    "static": ProviderFacts("gpuprov.providers.static",
                            no_price="existing hosts: gpuprov knows no price for machines it did not launch"),
}


def facts(name: str) -> ProviderFacts:
    """The registry's facts of provider ``name`` (an unknown name: bad input, naming the others)."""
    if name not in PROVIDERS:
        raise BadInput(f"unknown provider '{name}'; choose one of: {', '.join(sorted(PROVIDERS))}")
    return PROVIDERS[name]


def having(fact: str) -> list[str]:
    """The providers whose ``fact`` is true, in the registry's order."""
    return [n for n, f in PROVIDERS.items() if getattr(f, fact)]
# What `gpuprov up` launches on without --provider.
DEFAULT_PROVIDER = "aws"


def flag(name: str, default: Any = None) -> Any:
    """A provider option's field: ``name`` is the `gpuprov up` flag that sets it."""
    return field(default=default, metadata={"flag": name})


@dataclass(frozen=True)
class ProviderOptions:
    """A provider's own `up` flags, typed: each provider subclasses it (its ``options_type``),
    one field per flag it takes, declared with ``flag("--the-flag")``. That declaration is
    the only list of which flags a provider takes: ``options_for`` builds it from what the
    command line gave, and refuses a flag no field of it declares."""

    @classmethod
    def flags(cls) -> dict[str, str]:
        """{field: its flag} of this provider's options."""
        return {f.name: f.metadata["flag"] for f in fields(cls) if "flag" in f.metadata}

    def given(self) -> dict[str, Any]:
        """{field: value} of the options set to something other than their default."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}


# The fields a recorded spec keeps at its top level (the state's shape since its first version);
# every other option lives under its "options".
_TOP_LEVEL = ("region", "image", "ssh_cidr", "spot", "hosts_file")


@dataclass(frozen=True)
class ClusterSpec:
    """One request for a cluster, typed and frozen: built once from the command line (or from a
    cluster's record), checked by its provider (``Provider.check_spec``), and handed to the
    provider's plan and launch.

    ``count``: the nodes the cluster should have (a provider that ``adopts_existing`` reads
    "every host" as None). ``options``: the provider's own flags (its ``options_type``).
    ``stack``: what was asked of the version lock. ``settings``: where packages, artifacts
    and images come from, as recorded with the cluster (gpuprov.settings).
    ``min_count``, ``retries``, ``keep_failed``: `up --min-count` (a provider that takes it
    says so with ``partial_launch``). ``scheduler``: `--scheduler` and its controller."""

    name: str
    provider: str
    instance_type: str | None
    count: int | None
    options: ProviderOptions = field(default_factory=ProviderOptions)
    stack: StackChoice = field(default_factory=StackChoice)
    settings: dict[str, Any] | None = None
    min_count: int | None = None
    retries: int | None = None
    keep_failed: bool = False
    scheduler: Scheduler = field(default_factory=Scheduler)

    @property
    def launch_count(self) -> int:
        """``count`` for a provider that launches its nodes (only one that adopts existing hosts
        has a spec without it)."""
        if self.count is None:
            raise ValueError(f"{self.name}: a spec for launching nodes without a count")
        return self.count

    # The options core reads of any provider that has them (None where it has not).
    @property
    def region(self) -> str | None:
        return getattr(self.options, "region", None)

    @property
    def image(self) -> str | None:
        return getattr(self.options, "image", None)

    @property
    def hosts_file(self) -> str | None:
        return getattr(self.options, "hosts_file", None)

    @property
    def no_baked(self) -> bool:
        return bool(getattr(self.options, "no_baked", False))

    @property
    def os(self) -> str | None:
        return getattr(self.options, "os", None)

    @property
    def spot(self) -> bool:
        return bool(getattr(self.options, "spot", False))

    def with_options(self, **changes: Any) -> ClusterSpec:
        return replace(self, options=replace(self.options, **changes))

    def as_dict(self) -> dict[str, Any]:
        """The spec as the state records it (``from_record`` reads it back)."""
        own = asdict(self.options)
        top = {k: own.pop(k, None) for k in _TOP_LEVEL}
        top["spot"] = bool(top["spot"])
        rest = {**own, **self.stack.asked(), **self.stack.mirror(),
                **({"min_count": self.min_count} if self.min_count else {}),
                **({"retries": self.retries} if self.retries is not None else {}),
                **({"keep_failed": True} if self.keep_failed else {}),
                **({"settings": self.settings} if self.settings is not None else {})}
        # The scheduler's own keys as it writes them: a False there is a choice (`slurm_accounting`:
        # --no-accounting), not an unset flag, and as_options leaves out what is its default.
        return {"instance_type": self.instance_type, "count": self.count, **top,
                "options": {**{k: v for k, v in rest.items() if v is not None and v is not False},
                            **self.scheduler.as_options()}}

    @classmethod
    def from_record(cls, name: str, provider: str, raw: dict[str, Any], **changes: Any) -> ClusterSpec:
        """A cluster's recorded request as a spec (keys of other gpuprov versions ignored)."""
        opts = dict(raw.get("options") or {})
        flat = {**opts, **{k: raw.get(k) for k in _TOP_LEVEL if raw.get(k) is not None}}
        kind = options_type(provider)
        names = {f.name for f in fields(kind)}
        choice = StackChoice(**{f.name: opts.get(f.name) for f in fields(StackChoice)})
        spec = cls(name=name, provider=provider, instance_type=raw.get("instance_type"), count=raw.get("count"),
                   options=kind(**{k: v for k, v in flat.items() if k in names}), stack=choice,
                   settings=opts.get("settings"), min_count=opts.get("min_count"), retries=opts.get("retries"),
                   keep_failed=bool(opts.get("keep_failed")),
                   scheduler=Scheduler.from_options(opts))
        return replace(spec, **changes)


def options_type(name: str) -> type[ProviderOptions]:
    """Provider ``name``'s options type: its options module's ``OPTIONS`` (a light module:
    the provider's SDK is not loaded to read it)."""
    kind: type[ProviderOptions] = importlib.import_module(f"{facts(name).module}.options").OPTIONS
    return kind


def options_for(name: str, given: dict[str, Any]) -> ProviderOptions:
    """Provider ``name``'s options from the flags the command line gave ({field: value}; None
    and False: not given). A flag its options do not declare is refused, naming the providers
    that take it."""
    own = {f.name for f in fields(options_type(name))}
    for key, value in given.items():
        if key not in own and value not in (None, False):
            owners = [n for n in PROVIDERS if key in options_type(n).flags()]
            flag_name = options_type(owners[0]).flags()[key] if owners else key
            raise BadInput(f"{flag_name} is for --provider {' or '.join(owners)}")
    return options_type(name)(**{k: v for k, v in given.items() if k in own and v is not None})
