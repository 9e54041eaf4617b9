"""`gpuprov types --refresh`: the facts of every GPU instance type EC2 offers in a region."""

from __future__ import annotations

from gpuprov import catalog
from gpuprov.providers.aws import api


def refresh_catalog(region: str | None) -> tuple[int, str]:
    """Cache the facts of every GPU instance type EC2 offers in ``region``."""
    aws = api.connect(region)
    pages = aws.ec2.get_paginator("describe_instance_types").paginate()
    records = [t for page in pages for t in page["InstanceTypes"] if (t.get("GpuInfo") or {}).get("Gpus")]
    catalog.record_api_types(aws.region, records)
    return len(records), aws.region
