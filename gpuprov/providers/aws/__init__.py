"""EC2 through boto3: all-or-nothing launches, zone failover, nothing orphaned.

The cloud is the source of truth for what exists. Every resource a cluster
owns carries the tag ``gpuprov:cluster=NAME`` (instances, volumes, network
interfaces, elastic IPs, security group, placement group, key pair), so
``up`` completes a cluster by tag, and ``down``/``list`` work when local
state is gone.

One ``up``:
- plan: the type's facts (DescribeInstanceTypes, cached), the zones that
  offer it, members that already exist, the family's vCPU quota (Service
  Quotas; warn and go on when unreadable), the image, the caller's address;
  all read-only, all before anything is created;
- launch: key pair, security group (SSH from one address only, everything
  between members), a cluster placement group for EFA types, then one
  RunInstances with MinCount = MaxCount = the shortfall per zone tried, in
  one zone, failing over on capacity errors and stopping on quota errors;
- anything failing after instances exist (or Ctrl-C) terminates what this
  run launched and waits until it is gone.

Host keys: user-data carries one bootstrap host key per launch, pinned before
the first connection (so SSH checks it strictly from the start); over that
first connection each node makes its own host key and drops the bootstrap one
(``hostkeys.py``), so no key any sshd uses is readable from user-data or IMDS.

Modules, by phase: ``preflight`` (checks and plan: a frozen AwsPlan carried in
``Plan.details``), ``dryrun``, ``resources`` (key pair, security group, placement
group), ``launch`` (zone failover, rollback), ``ready`` (addresses, host keys, SSH),
``teardown`` (terminate, find by tag), ``refresh`` (the catalog), ``s3`` (pull mode's channel:
the cluster's bucket), ``s3_named`` (or its prefix in a bucket the pull_bucket setting names),
``provider`` (the class that routes to them), ``common`` (tags and what they share),
``options`` (its `up` flags).
This file only exports, each name loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# What this package exports, and the module each comes from: loaded on first use (PEP 562), so
# reading the light ``options`` module does not load boto3.
_EXPORTS = {
    "TAG": "common", "LaunchFailed": "common", "AwsPlan": "preflight", "check_cidr": "preflight",
    "AwsProvider": "provider", "refresh_catalog": "refresh",
}

__all__ = ["PROVIDER", "TAG", "AwsPlan", "AwsProvider", "LaunchFailed", "check_cidr", "refresh_catalog"]


def __getattr__(name: str) -> Any:
    if name == "PROVIDER":
        value: Any = import_module(f"{__name__}.provider").AwsProvider()
    elif name in _EXPORTS:
        value = getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
