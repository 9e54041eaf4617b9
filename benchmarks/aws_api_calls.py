#!/usr/bin/env python3
"""EC2 API calls of one `gpuprov up --count 4` (p4d.24xlarge), by name and count.

    python benchmarks/aws_api_calls.py [--count 4] [--type p4d.24xlarge] [--rerun-ssh-cidr CIDR]
                                       [--image-from image|default|baked] [--max-count M]

Runs against moto's server (no AWS) behind the test shim (tests/aws/moto_shim.py),
which adds what moto lacks (placement groups; no public address for
multi-interface launches, as on EC2) and logs every call. Fresh state dir and
fresh moto, so the catalog cache is cold: the figures are those of a first
`up` in a region. `--no-bootstrap`: SSH and playbooks make no API calls.
`--rerun-ssh-cidr`: then count the calls of a second `up` of the same cluster
from another SSH range (nothing to launch; the SSH rule is replaced).
The host key hand-over (after launch, over SSH) makes no API call.
`--max-count M`: an elastic Slurm cluster (`--scheduler slurm --max-count M`, an AMI baked for the
lock from a Slurm node and the account's managed policy gpuprov-power made first); then the calls
of its set-up for the controller's power service (what the first play that configures Slurm
makes: gpuprov.slurm.power_aws_bundle.set_up), of the resume of each dynamic node as the service
makes it (gpuprov.providers.aws.power.resume), and of `down`.
A figure, not a test.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--type", default="p4d.24xlarge")
    parser.add_argument("--rerun-ssh-cidr", metavar="CIDR", help="also count a re-run from this SSH range")
    parser.add_argument("--max-count", type=int, help="an elastic Slurm cluster: also its set-up, each "
                        "dynamic node's resume and its down")
    parser.add_argument("--image-from", choices=["image", "default", "baked"], default="image",
                        help="image: --image AMI (the figure of earlier runs); default: no --image, the "
                        "default image from its SSM parameter, no AMI baked for the lock (one more "
                        "DescribeImages: the look-up of a baked AMI); baked: no --image, an AMI of "
                        "this account tagged with the cluster's lock is found and booted")
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    from tests.aws.moto_shim import start

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    shim, http = start(f"{host}:{port}")
    os.environ.update(
        AWS_ENDPOINT_URL=shim.url, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
        GPUPROV_HOME=tempfile.mkdtemp(prefix="gpuprov-bench-aws-"),
    )
    from gpuprov.cli.app import main as cli

    image = "ami-03cf127a"  # one of moto's bundled images
    argv = ["up", "--name", "bench", "--type", args.type, "--count", str(args.count),
            "--ssh-cidr", "203.0.113.7/32", "--no-bootstrap", "--yes", "-o", "json"]
    if args.image_from == "image":
        argv[7:7] = ["--image", image]
    else:
        from gpuprov.providers.aws import preflight

        ssm_name, _, _ = preflight.IMAGE_SOURCES[preflight.DEFAULT_OS]
        shim.ssm_parameters[ssm_name.format(arch="amd64")] = image
    if args.image_from == "baked":
        _bake_for_the_lock(args.type, image)
    if args.max_count:
        argv[-3:-3] = ["--scheduler", "slurm", "--max-count", str(args.max_count)]
        _bake_for_the_lock(args.type, image, slurm=True)
        _managed_policy()
    runs = [("first up", argv)]
    if args.rerun_ssh_cidr:
        runs.append(("re-run", [a if a != "203.0.113.7/32" else args.rerun_ssh_cidr for a in argv]))
    try:
        for label, run in runs:
            shim.calls.clear()
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # the cluster's JSON: not the figure
                    cli(run)
            except SystemExit as exc:
                if exc.code:
                    sys.exit(f"gpuprov up failed ({exc.code})")
            report(label, run, shim)
        if args.max_count:
            _elastic(shim, cli)
    finally:
        http.shutdown()
        server.stop()


def _managed_policy() -> None:
    """The account's managed policy gpuprov-power, as an administrator makes it once."""
    import boto3

    from gpuprov.providers.aws import power_setup

    boto3.client("iam").create_policy(PolicyName=power_setup.MANAGED_POLICY,
                                      PolicyDocument=(ROOT / "docs" / "aws-iam-policy-power.json").read_text())


def _elastic(shim, cli) -> None:
    """The elastic cluster's set-up, each dynamic node's resume, and `down`, each reported."""
    import boto3

    from gpuprov.cluster import files_for
    from gpuprov.console import Console
    from gpuprov.providers import get
    from gpuprov.providers.aws import power
    from gpuprov.slurm import power_aws_bundle
    from gpuprov.state import Store

    cluster = Store().get_cluster("bench")
    shim.calls.clear()
    with contextlib.redirect_stderr(io.StringIO()):
        got = power_aws_bundle.set_up(cluster, get("aws"), files_for("bench"), list(cluster.nodes), Console().say)
    report("the elastic set-up before the slurm play", ["provision", "bench"], shim)
    config = got["aws"]["config"]
    plan = power.Plan("bench", config["launch_template"], config["image"], config["instance_type"],
                      dict(config["subnets"]), int(config.get("efa_cards") or 0),
                      str(config.get("security_group") or ""), dict(config.get("placement_groups") or []))
    shim.calls.clear()
    ec2, names = boto3.client("ec2"), [f"bench-dy-{i}" for i in range(1, config["count"] + 1)]
    for name in names:
        started = power.resume(ec2, plan, name, power.Rests(), 0.0, f"bench-{name}")
        if not isinstance(started, power.Started):
            sys.exit(f"resume of {name} refused: {started}")
    report(f"the resume of {len(names)} dynamic node(s), as the controller's service makes it", ["(service)"], shim)
    shim.calls.clear()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cli(["down", "bench", "--yes"])
    except SystemExit as exc:
        if exc.code:
            sys.exit(f"gpuprov down failed ({exc.code})")
    report("down", ["down", "bench", "--yes"], shim)


def _bake_for_the_lock(instance_type: str, source_image: str, slurm: bool = False) -> None:
    """An AMI of this account tagged with the lock `up` resolves (as `image bake` leaves it;
    ``slurm``: as a bake of a Slurm cluster's node leaves it)."""
    import boto3

    from gpuprov.lock import stack
    from gpuprov.providers.aws import preflight

    lock = stack.resolve(instance_type, source="nvidia").as_dict()
    ec2 = boto3.client("ec2")
    iid = ec2.run_instances(ImageId=source_image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge")["Instances"][0][
        "InstanceId"]
    tags = [{"Key": "gpuprov:lock", "Value": lock["hash"]}, {"Key": "gpuprov:os", "Value": preflight.DEFAULT_OS},
            {"Key": "gpuprov:baked-at", "Value": "2026-11-25T00:00:00Z"},
            *([{"Key": "gpuprov:slurm", "Value": "yes"}] if slurm else [])]
    ec2.create_image(InstanceId=iid, Name="bench-baked", TagSpecifications=[{"ResourceType": "image", "Tags": tags}])
    ec2.terminate_instances(InstanceIds=[iid])


def report(label: str, argv: list[str], shim) -> None:
    by_service = collections.defaultdict(collections.Counter)
    for call in shim.calls:
        by_service[call.service][call.action + (" (DryRun)" if call.dry_run else "")] += 1
    print(f"\nAPI calls of ({label}): gpuprov {' '.join(argv)}", file=sys.stderr)
    print(f"== {label}")
    for service, counter in sorted(by_service.items()):
        print(f"{service}: {sum(counter.values())} calls")
        for action, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {n:3d}  {action}")
    ec2 = [c.action for c in shim.calls if c.service == "ec2"]
    print(f"ec2 total: {len(ec2)}; mutating: {len(shim.mutating())}")


if __name__ == "__main__":
    main()
