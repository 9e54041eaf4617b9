"""`up --dry-run` where boto3 finds no AWS credentials here: the plan and its cost from what
gpuprov carries (the catalog, the bundled price table, the price cache of an earlier
`types --refresh`), and one line naming what only AWS answers. Nothing is asked of AWS; with
credentials, preflight.py asks it everything (this module then has no say)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprov import catalog
from gpuprov.pricing import prices
from gpuprov.providers import ClusterSpec, Plan
from gpuprov.providers.aws import api, options

# What preflight.py and dryrun.py ask AWS, in the plan's words.
NOT_CHECKED = ("the zones that offer the type and their capacity", "the vCPU quota", "the image",
               "members already running", "your public address for SSH", "the permissions (EC2 DryRun)")


@dataclass(frozen=True)
class Unasked:
    """``Plan.details`` of a plan AWS was not asked about: its dry run asks nothing either."""

    region: str
    region_from: str  # --region, AWS_DEFAULT_REGION, AWS_REGION, the profile, or "the default"


def plan(spec: ClusterSpec) -> Plan | None:
    """The plan of ``spec`` (checked by the provider's check_spec) without AWS; None where
    credentials are found."""
    found = api.without_credentials(spec.region)
    if found is None:
        return None
    region, source = found
    spec = spec.with_options(region=region)
    itype = catalog.get(spec.instance_type or "", region=region)
    spot = options.of(spec).spot
    price = prices.price(itype, region, spot_price=spot)
    said = ("the default, as `gpuprov types` takes it: no --region, AWS_DEFAULT_REGION, AWS_REGION or "
            "profile region here" if source == "the default" else f"from {source}")
    notes = [f"region {region} ({said})"]
    if price is None:
        notes.append(prices.why_none(itype, region, spot_price=spot))
    notes.append("not checked without AWS credentials: " + ", ".join(NOT_CHECKED)
                 + "; with credentials (docs/aws.md) the same command checks them")
    return Plan(spec=spec, existing=0, billable=True, price_per_node_hour=price.usd_per_hour if price else None,
                price=price, notes=tuple(notes), details=Unasked(region, source))
