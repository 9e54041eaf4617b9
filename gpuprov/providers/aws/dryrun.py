"""`up --dry-run`: ask EC2 (DryRun=True) whether every mutating call is allowed."""

from __future__ import annotations

from typing import Any

from gpuprov.errors import GpuprovError
from gpuprov.providers import Reporter
from gpuprov.providers.aws import api, s3, s3_named
from gpuprov.providers.aws.common import tag_specs
from gpuprov.providers.aws.launch import run_params
from gpuprov.providers.aws.preflight import AwsPlan
from gpuprov.providers.aws.resources import default_subnets, ingress_rules, uses_placement_group

# Placeholders for DryRun checks of calls that act on resources not made yet.
_DUMMY = {"instance": "i-0000000000000000f", "sg": "sg-0000000000000000f", "eip": "eipalloc-0000000000000000f"}
_DUMMY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBvUWBaXnRzrFJ6sIa2Dk2yRo4eMUzFybrsZ8GMKkHs0 dry-run"


def dry_run(prep: AwsPlan, report: Reporter, pull: bool = False) -> None:
    """Ask EC2 (DryRun=True) whether every mutating call up and down make is allowed; with
    ``pull``, ask about the S3 calls of pull mode's channel too (s3.dry_run).

    Tags are given at creation (TagSpecifications), so there is no standalone
    CreateTags to ask about: the policy allows CreateTags only within a create call."""
    spec, ec2 = prep.spec, prep.aws.ec2
    subnet = default_subnets(prep.aws).get(prep.zones[0], "")
    tags = lambda kind: tag_specs(spec.name, kind)  # noqa: E731
    checks: list[tuple[str, Any, dict[str, Any]]] = [
        ("ImportKeyPair", ec2.import_key_pair,
         {"KeyName": f"gpuprov-dryrun-{spec.name}", "PublicKeyMaterial": _DUMMY_KEY.encode(),
          "TagSpecifications": tags("key-pair")}),
        ("CreateSecurityGroup", ec2.create_security_group,
         {"GroupName": f"gpuprov-dryrun-{spec.name}", "Description": "gpuprov dry run",
          "TagSpecifications": tags("security-group")}),
        ("AuthorizeSecurityGroupIngress", ec2.authorize_security_group_ingress,
         {"GroupId": _DUMMY["sg"], "IpPermissions": ingress_rules(_DUMMY["sg"], prep.ssh_cidr)}),
        ("RevokeSecurityGroupIngress", ec2.revoke_security_group_ingress,
         {"GroupId": _DUMMY["sg"], "IpPermissions": ingress_rules(_DUMMY["sg"], prep.ssh_cidr)[:1]}),
        ("RunInstances", ec2.run_instances,
         run_params(prep, spec, subnet, _DUMMY["sg"], prep.zones[0], None, "dryrun", b"", 1, 1)),
        ("AllocateAddress", ec2.allocate_address,
         {"Domain": "vpc", "TagSpecifications": tags("elastic-ip")}),
        ("AssociateAddress", ec2.associate_address,
         {"AllocationId": _DUMMY["eip"], "InstanceId": _DUMMY["instance"]}),
        ("TerminateInstances", ec2.terminate_instances, {"InstanceIds": [_DUMMY["instance"]]}),
        ("ReleaseAddress", ec2.release_address, {"AllocationId": _DUMMY["eip"]}),
        ("DeleteSecurityGroup", ec2.delete_security_group, {"GroupId": _DUMMY["sg"]}),
        ("DeleteKeyPair", ec2.delete_key_pair, {"KeyName": f"gpuprov-dryrun-{spec.name}"}),
    ]
    if uses_placement_group(prep.itype, spec.launch_count):
        checks[3:3] = [
            ("CreatePlacementGroup", ec2.create_placement_group,
             {"GroupName": f"gpuprov-dryrun-{spec.name}", "Strategy": "cluster",
              "TagSpecifications": tags("placement-group")}),
            ("DeletePlacementGroup", ec2.delete_placement_group,
             {"GroupName": f"gpuprov-dryrun-{spec.name}"}),
        ]
    refused = []
    for what, fn, kwargs in checks:
        ok, reason = api.dry_run(fn, **kwargs)
        if ok:
            report(f"dry run: ec2:{what} allowed")
        elif ok is None:
            report(f"dry run: ec2:{what} not checked ({reason})")
        else:
            report(f"dry run: ec2:{what} REFUSED ({reason})")
            refused.append(what)
    refused = [f"ec2:{what}" for what in refused]
    bucket = s3_named.named(spec.settings) if pull else None  # pull_bucket: a prefix there, no bucket made
    if pull:
        refused += (s3_named.dry_run(prep.aws, spec.name, bucket, report) if bucket
                    else s3.dry_run(prep.aws, spec.name, report))
    if refused:
        named = f" and {s3_named.POLICY_DOC}" if bucket and any(r.startswith("s3:") for r in refused) else ""
        raise GpuprovError(
            "AWS refuses " + ", ".join(refused)
            + f" for these credentials; see docs/aws-iam-policy.json{named} for what gpuprov needs"
        )
