"""Which AWS regions exist, without loading boto3 or botocore (`gpuprov types` starts fast).

The list is botocore's own (its ``data/endpoints.json``: the regions of every partition that
EC2 has an endpoint in), the one ``gpuprov.providers.aws.api.check_region`` asks botocore for,
so `types --region` refuses what `up --region` refuses, with the same words.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path

from gpuprov.errors import BadInput

FALLBACK_REGION = "us-east-1"


@lru_cache(maxsize=1)
def known() -> frozenset[str]:
    """The AWS regions with an EC2 endpoint (empty: botocore is not installed; nothing refused)."""
    spec = importlib.util.find_spec("botocore")
    if spec is None or not spec.origin:
        return frozenset()
    try:
        data = json.loads((Path(spec.origin).parent / "data" / "endpoints.json").read_text())
    except (OSError, ValueError):
        return frozenset()
    found: set[str] = set()
    for partition in data.get("partitions", []):
        regions = set(partition.get("regions", {}))
        endpoints = set(partition.get("services", {}).get("ec2", {}).get("endpoints", {}))
        found |= regions & endpoints
    return frozenset(found)


def check(name: str) -> str:
    """``name`` when it is an AWS region; BadInput (one line, as `up` says it) otherwise."""
    regions = known()
    if regions and name not in regions:
        close = difflib.get_close_matches(name, sorted(regions), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise BadInput(f"unknown AWS region '{name}'{hint}")
    return name


def chosen(region: str | None) -> tuple[str, str]:
    """(region, where it came from) for a price: --region, AWS_DEFAULT_REGION, AWS_REGION, else
    us-east-1 (the profile's region is not read here: that would load botocore)."""
    if region:
        return check(region), "--region"
    for variable in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        value = os.environ.get(variable, "").strip()
        if value:
            return check(value), variable
    return FALLBACK_REGION, "the default"
