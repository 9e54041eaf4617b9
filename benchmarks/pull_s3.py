#!/usr/bin/env python3
"""The controller's cost per node of `up --provider aws`, pull through S3 against push, on the
emulated EC2 whose instances are real nodes (`make bench`; a figure, not a test).

    python benchmarks/pull_s3.py [--sizes 1,3] [--modes push,pull] [--tags spot]

For each N and mode: `gpuprov up --provider aws --count N --bootstrap MODE --tags T --health off`
on fresh emulated instances (tests/aws/ec2_nodes.py: each a systemd node container booted by
cloud-init from the launch's user-data), against moto's EC2 behind the test shim and moto's S3
behind the front that checks presigned requests as S3 does (tests/aws/s3_front.py, bound on the
docker bridge's gateway for the nodes), then `down`. Measured: the wall time of `up`, and the
CPU and peak memory of the controller (the `up` process and everything it started: SSH for the
host-key hand-over in both modes; ansible-playbook and its forks in push mode; the bundle build
and upload, the agents' hand-over over SSH and the S3 listing and reads in pull mode). moto and
the fixtures run in this process, not under `up`: their CPU is not the controller's. The S3
requests of the pull runs are counted at the front. Writes bench-results/pull-s3-<time>.json
and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,3")
    parser.add_argument("--modes", default="push,pull")
    parser.add_argument("--tags", default="spot")
    args = parser.parse_args()
    import tempfile

    from bootstrap_scale import measured
    from moto.server import ThreadedMotoServer

    from gpuprov.providers.docker import bridge_gateway
    from tests.aws import ec2_nodes
    from tests.aws.moto_shim import start
    from tests.aws.s3_front import Front

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    shim, http = start(f"{host}:{port}")
    front = Front(f"{host}:{port}", host=bridge_gateway())
    home = tempfile.mkdtemp(prefix="gpuprov-bench-")
    env = {**os.environ, "AWS_ENDPOINT_URL": shim.url, "AWS_ENDPOINT_URL_S3": front.url,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "GPUPROV_HOME": home, "GPUPROV_AWS_SSH_TIMEOUT": "300",
           "AWS_CONFIG_FILE": os.path.join(home, "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": os.path.join(home, "no-aws-credentials")}
    env.pop("AWS_PROFILE", None)
    nodes = ec2_nodes.Ec2Nodes(apt_proxy=os.environ["GPUPROV_APT_PROXY"])
    shim.nodes = nodes
    rows = []
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            for mode in args.modes.split(","):
                name = f"bench-{mode}-{size}"
                front.refused.clear()
                gets_before = front.bundle_gets
                row = measured(["up", "--provider", "aws", "--name", name, "--count", str(size), "--type",
                                "g5.xlarge", "--image", "ami-03cf127a", "--ssh-cidr", "127.0.0.1/32",
                                "--tags", args.tags, "--health", "off", "--bootstrap", mode, "--yes"], env)
                row |= {"mode": mode, "n": size, "per_node_cpu_s": round(row["controller_cpu_s"] / size, 2),
                        "bundle_gets": front.bundle_gets - gets_before, "s3_refused": len(front.refused)}
                measured(["down", name, "--yes"], env)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        shim.nodes = None
        nodes.close()
        front.close()
        http.shutdown()
        moto.stop()
    out = ROOT / "bench-results" / f"pull-s3-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| mode | N | up (s) | controller CPU (s) | per node | controller memory, peak (MB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['n']} | {r['wall_s']} | {r['controller_cpu_s']} | {r['per_node_cpu_s']} | "
              f"{r['controller_peak_mb']} |")
    print(f"\n{out}")


if __name__ == "__main__":
    main()
