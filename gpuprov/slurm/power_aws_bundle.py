"""The power service of an elastic AWS cluster, shipped: a zipapp of the gpuprov modules
gpuprov.slurm.power_aws_node runs on (what it imports when it starts), for the slurm role to
copy to the controller, where its unit runs it as ``python3 -I power-aws.pyz`` with Debian's
python3-boto3 (the one package it needs beyond the standard library, imported only when it
first calls EC2). The same bytes for the same source (gpuprov.zipapp).
tests/unit/test_power_aws_bundle.py proves that every gpuprov module the service imports is in
it, and that it runs from it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuprov import zipapp
from gpuprov.errors import GpuprovError
from gpuprov.providers import ClusterFiles, Provider, Reporter
from gpuprov.providers.aws import power, power_setup
from gpuprov.slurm import munge, scheduler
from gpuprov.state import ClusterRecord, NodeRecord

FILES = (
    "__init__.py", "clock.py", "defaults.py", "errors.py", "identity.py", "lock_holder.py", "node_text.py",
    "paths.py", "ssh.py", "state.py", "state_choice.py", "validate.py",
    "lock/__init__.py", "lock/lock_data.py", "lock/stack_choice.py",
    "pricing/__init__.py", "pricing/regions.py",
    "providers/__init__.py", "providers/spec.py",
    *(f"providers/aws/{m}.py" for m in ("__init__", "api", "common", "power", "power_boot")),
    *(f"results/{m}.py" for m in ("__init__", "costs", "json_form", "manifest", "shapes")),
    "sharing/__init__.py", "sharing/choice.py",
    *(f"slurm/{m}.py" for m in ("__init__", "accounting", "conf", "drain", "elastic", "munge", "power_aws_node",
                                 "power_http", "power_rules", "scheduler", "scheduler_choice", "topology")),
)
MAIN = b"import sys\n\nfrom gpuprov.slurm.power_aws_node import main\n\nsys.exit(main())\n"
NAME = "power-aws.pyz"


_BUNDLE = zipapp.Bundle(NAME, MAIN, FILES)
build = _BUNDLE.build  # the zipapp's bytes, from the source of the gpuprov this is
write = _BUNDLE.write  # the zipapp in a directory (rewritten only when its bytes differ), and its path

# Where the service listens on the controller's loopback (the power program's URL).
PORT = 8741
# How long slurmctld waits for a dynamic EC2 node to register (ResumeTimeout): an instance's
# boot, its join over SSH and its slurmd's first contact; ParallelCluster's default is 1800 s.
RESUME_TIMEOUT_S = 900


def play_vars(directory: Path, setup: power_setup.Made, plan: power.Plan, *, region: str, count: int,
              controller_addr: str, key_src: str) -> dict[str, Any]:
    """The slurm play's ``slurm_power_service`` for an elastic AWS cluster's controller: the
    power program's loopback URL, the power key's file, and the service itself (this zipapp,
    written into ``directory``, the cluster's own; its configuration: the launch template and
    image of ``plan``, the zones' subnets in order, how its nodes join). The role adds the key's
    and the rests' paths on the node; the service checks the whole before it is written there."""
    return {"url": f"http://127.0.0.1:{PORT}/power", "key_src": key_src, "aws": {
        "pyz_src": str(write(directory)),
        "config": {"cluster": plan.cluster, "region": region, "launch_template": setup.template,
                   "image": plan.image, "instance_type": plan.instance_type,
                   "subnets": [[zone, subnet] for zone, subnet in plan.subnets.items()], "count": count,
                   **({"efa_cards": plan.efa_cards, "security_group": plan.security_group} if plan.efa_cards else {}),
                   **({"placement_groups": [[z, g] for z, g in plan.placement_groups.items()]}
                      if plan.placement_groups else {}),
                   "port": PORT, "join": {"controller_addr": controller_addr}}}}


def set_up(cluster: ClusterRecord, provider: Provider, files: ClusterFiles, nodes: list[NodeRecord],
           say: Reporter) -> dict[str, Any]:
    """Before the play that configures Slurm on an elastic AWS cluster (`up` after its launch,
    `provision`; docs/slurm.md, "Elastic nodes on AWS"): the image its dynamic nodes boot from
    (the newest baked for its lock from a Slurm node), the provider's part made where missing
    (Provider.power_prepare: the launch template, the controller's role and profile), and what
    the slurm play hands the controller's service, written to the cluster's
    scheduler.POWER_ON_NODE (0600) for scheduler.dynamic_vars and returned."""
    chosen = scheduler.of(cluster)
    controller_name = scheduler.controller_of(cluster, chosen)
    controller = next((n for n in nodes if n.name == controller_name), None)
    template = scheduler.template_node(cluster, chosen)
    like = next((n for n in cluster.nodes if n.name == template), None)
    if controller is None or like is None or not controller.extra.get("private_ip") \
            or not controller.extra.get("region"):
        raise GpuprovError(f"{cluster.name}: its controller {controller_name} is not running with a private "
                           "address: its power service cannot be set up (`gpuprov status` says why)")
    region = str(controller.extra.get("region") or "")
    image = provider.dynamic_image(region or None, str((cluster.lock or {}).get("hash") or ""), cluster.name,
                                   like.instance_type)
    disk = (cluster.spec.get("options") or {}).get("disk_gb")
    made, plan = provider.power_prepare(cluster.name, controller, like, image,
                                        disk if isinstance(disk, int) else None, files, say)
    count = (chosen.max_count or 0) - len(cluster.nodes)
    out = play_vars(files.dir, made, plan, region=region, count=count,
                    controller_addr=str(controller.extra["private_ip"]),
                    key_src=str(munge.ensure_key(files.dir / scheduler.POWER_KEY)))
    out["resume_timeout"] = RESUME_TIMEOUT_S
    path = files.dir / scheduler.POWER_ON_NODE
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out, sort_keys=True, indent=1) + "\n")
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    say(f"{cluster.name}: {count} dynamic node(s) of {like.instance_type} boot from {image} in "
        f"{', '.join(plan.subnets)}; the power service runs on {controller.name}")
    return out
