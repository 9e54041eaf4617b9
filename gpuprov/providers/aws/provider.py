"""The AWS provider: each phase lives in its own module; this class only routes to them.

plan (preflight.py; a dry run without credentials: offline.py) -> launch (launch.py,
resources.py) -> wait_ready (ready.py) ->
describe -> terminate (teardown.py). What plan prepared travels in ``Plan.details``
(a frozen AwsPlan): nothing is cached on the provider between calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuprov import paths
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles, ClusterSpec, Orphans, Plan, Provider, Reporter
from gpuprov.providers.aws import (
    api,
    dryrun,
    images,
    launch,
    offline,
    power_setup,
    preflight,
    ready,
    s3,
    s3_named,
    teardown,
    topology,
)
from gpuprov.providers.aws.common import members, node_record, read_record, region_of, update_record
from gpuprov.providers.aws.options import AwsOptions, of
from gpuprov.state import NodeRecord


class AwsProvider(Provider):
    name = "aws"
    display_name = "AWS"
    billable = True
    bake_consumes_node = True
    copies_images = True
    images_cost_a_call = True
    # Dynamic Slurm nodes on EC2: the controller's power service launches them from an AMI baked
    # for the lock from a Slurm node (power_setup.prepare, gpuprov.slurm.power_aws_bundle.set_up).
    powers_nodes = True
    powers_from_controller = True
    options_type = AwsOptions
    partial_launch = True  # EC2's MinCount: `up --min-count`

    def check_type(self, spec: ClusterSpec) -> None:
        preflight.check_type(spec)

    def check_spec(self, spec: ClusterSpec) -> ClusterSpec:
        return preflight.check_spec(super().check_spec(spec))

    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        return preflight.make_plan(self.check_spec(spec))

    def unasked_plan(self, spec: ClusterSpec) -> Plan | None:
        return offline.plan(spec)

    def dry_run(self, plan: Plan, report: Reporter) -> None:
        if isinstance(plan.details, offline.Unasked):  # no credentials: its notes say what is not checked
            return
        dryrun.dry_run(self._details(plan), report, pull=plan.pull is not None)

    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        return launch.launch_cluster(self._details(plan), plan.to_create, plan.min_create or plan.to_create,
                                     files, report)

    def _details(self, plan: Plan) -> preflight.AwsPlan:
        """This provider's own plan of ``plan.spec``: the one plan() made, else made now."""
        details = plan.details
        if isinstance(details, preflight.AwsPlan) and details.spec == plan.spec:
            return details
        return preflight.prepare(self.check_spec(plan.spec))

    def wait_ready(
        self, spec: ClusterSpec, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter
    ) -> list[NodeRecord]:
        return ready.wait_ready(nodes, files, report)

    def describe(self, name: str, known: list[NodeRecord], files: ClusterFiles) -> list[NodeRecord]:
        aws = api.connect(region_of(known, files))
        nodes = sorted((node_record(i, name, aws.region) for i in members(aws, name, static=True)),
                       key=lambda n: n.extra["index"])
        running = [n for n in nodes if n.address and n.state == "running"]
        if running and files.dir.is_dir():
            ready.pin(running, files, strict=False)
        return nodes

    def network_nodes(self, nodes: list[NodeRecord], say: Callable[[str], None]) -> dict[str, tuple[str, ...]]:
        return topology.network_nodes(nodes, say)

    def terminate(self, name: str, known: list[NodeRecord], files: ClusterFiles, report: Reporter) -> int:
        record = read_record(files)
        return teardown.destroy(name, region_of(known, files), report, [n.id for n in known],
                                buckets=record.get("pull_buckets", []), power=record.get("power") is True)

    def pull_channel(self, spec: ClusterSpec, report: Reporter) -> s3.Channel:
        """Pull mode's channel: the cluster's private S3 bucket (s3.py), or its prefix in the
        bucket its settings name (pull_bucket: s3_named.py), recorded first for `down`."""
        bucket = s3_named.named(spec.settings)
        if bucket is None:
            return s3.open_channel(spec.name, of(spec).region, report)
        update_record(ClusterFiles(paths.cluster_dir(spec.name, create=False)), pull_bucket=bucket)
        return s3_named.open_channel(spec.name, bucket, of(spec).region, report)

    def pull_channel_check(self, spec: ClusterSpec, report: Reporter) -> None:
        """Before anything is launched: the bucket a ``pull_bucket`` setting names is reached, in
        the cluster's region (s3_named.reach: BadInput where it is missing or elsewhere). The
        cluster's own bucket is made after the launch, and found by its tag by `down`."""
        bucket = s3_named.named(spec.settings)
        if bucket is not None:
            s3_named.reach(api.connect(of(spec).region), bucket, spec.name)

    def terminate_nodes(self, nodes: list[NodeRecord], files: ClusterFiles, report: Reporter) -> list[str]:
        return teardown.terminate_nodes(nodes, files, report)

    def find_orphans(self, name: str, region: str | None) -> Orphans | None:
        return teardown.find_orphans(name, region)

    def destroy_orphans(self, name: str, orphans: Orphans, report: Reporter) -> int:
        return teardown.destroy(name, orphans.region, report)

    def list_tagged_clusters(self, regions: set[str | None], asked: bool) -> dict[str, dict[str, Any]] | None:
        return teardown.list_tagged_clusters(regions, asked)

    def dynamic_image(self, region: str | None, lock_hash: str, cluster: str, instance_type: str) -> str:
        found = images.slurm_image(region, lock_hash)
        if found is None:
            where = f" --region {region}" if region else ""
            raise BadInput(f"--max-count on aws: no image of this account is baked for lock {lock_hash} from a "
                           f"Slurm node (tag {images.SLURM_TAG}), and dynamic nodes boot from one: `gpuprov image "
                           f"bake --provider aws --type {instance_type}{where} --scheduler slurm` bakes it "
                           f"(docs/slurm.md, \"Elastic nodes on AWS\"); nothing done for {cluster}")
        return found

    def power_prepare(self, cluster: str, controller: NodeRecord, like: NodeRecord, image: str,
                      disk_gb: int | None, files: ClusterFiles, report: Reporter) -> tuple[Any, Any]:
        return power_setup.prepare(cluster, controller, like, image, disk_gb, files, report)

    # -- baked images (images.py) ---------------------------------------------------------------
    def baked_images(self, region: str | None = None) -> list[Any]:
        return images.baked(region)

    def bake(self, cluster: Any, node: NodeRecord, files: ClusterFiles, report: Reporter,
             copy_to: tuple[str, ...] = ()) -> Any:
        return images.bake(cluster, node, files, report, copy_to)

    def image_locks(self, image_ids: set[str], region: str | None = None) -> dict[str, str]:
        return images.locks_of(image_ids, region)

    def delete_image(self, image: Any, report: Reporter) -> None:
        images.delete(image, report)

    def expectations(self, node: NodeRecord) -> dict[str, Any]:
        out = super().expectations(node)
        out["spot"] = bool(node.extra.get("spot"))
        return out
