"""`up --provider aws --bootstrap pull` end to end, through the real CLI, on the emulated EC2
whose instances are real nodes (tests/aws/ec2_nodes.py, a labelled fixture) and moto's S3
behind S3's own checks of presigned requests (tests/aws/s3_front.py, a labelled fixture:
moto checks no signature), bound on the docker bridge's gateway so that the nodes reach it.

`up` makes the cluster's private bucket, uploads the bundle once under its sha256, hands each
node over SSH (pinned host key) its presigned GET and its report POST policy; each node fetches
the bundle from S3, checks its sha256, runs the plays on itself and writes its report batches
under its own prefix; `up` lists and reads them as per-node progress and records the runs. One
node is given a tampered bundle (the front's FIXTURE fault: one byte changed on the way): it
refuses it, unpacks nothing, says so, and fails alone; `--min-count` replaces it, and the
replacement round uploads nothing new (the same bundle, new URLs). `provision --via pull`
converges the three nodes again through the same bucket, and `patch --via pull --check` plans a
roll through it (a patch's bundle, each node's own verdict read back). `down` leaves no
instance, no object and no bucket.

What it costs, and why: four node containers boot (three launched, one replacement), and
three of them run `--tags spot` (the cheapest play that writes on every node: its common
role, about 20 tasks, no package install) and the quick probes on themselves; the fourth
node's bootstrap ends at its refused fetch. 61 s on this 2-core machine (2026-11-27; 93 to 143 s
while other suites shared it); the full stack through pull is tests/e2e/test_pull_e2e.py's and
test_docker_cluster.py's to prove.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aws import ec2_nodes
from tests.aws.conftest import MOTO_AMI, _shim_server, ec2, instances, moto_server, shim  # noqa: F401 (fixtures)
from tests.aws.moto_shim import Shim
from tests.aws.s3_front import Front
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

FLAGS = ("--type", "g5.xlarge", "--image", MOTO_AMI, "--ssh-cidr", "127.0.0.1/32", "--tags", "spot",
         "--health", "off", "--bootstrap", "pull", "--yes", "-o", "json")


@pytest.fixture
def s3_front(shim: Shim, moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Front]:  # noqa: F811
    """moto's S3 behind the signature-checking front, on the bridge gateway the nodes reach."""
    from gpuprov.providers.docker import bridge_gateway

    front = Front(moto_server, host=bridge_gateway())
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", front.url)
    yield front
    front.close()


def _buckets() -> list[str]:
    import boto3

    return [b["Name"] for b in boto3.client("s3", region_name="us-east-1").list_buckets()["Buckets"]]


def test_up_pulls_through_s3_refuses_a_tampered_bundle_and_down_leaves_nothing(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes, s3_front: Front) -> None:  # noqa: F811
    s3_front.tamper_bundles = 1  # the first node to fetch gets another bundle
    proc = run_cli("up", "--name", "ps3", "--count", "3", "--min-count", "3", "--retries", "1", *FLAGS,
                   timeout=900)
    err = proc.stderr
    assert proc.returncode == 0, err[-5000:]
    result = json.loads(proc.stdout)
    sha = result["bootstrap"]["pull"]["bundle_sha256"]
    (bucket,) = _buckets()
    assert bucket.startswith("gpuprov-ps3-")
    assert f"S3 bucket {bucket} created" in err and f"uploaded to {bucket} for 3 node(s)" in err, err[-5000:]
    # The tampered node: refused, named, replaced; the round uploaded nothing new.
    refused = [line for line in err.splitlines() if ": bootstrap failed: bundle sha256 " in line]
    assert len(refused) == 1 and f"expected {sha}: not unpacked, not run" in refused[0], err[-5000:]
    (row,) = result["replaced"]
    assert refused[0].startswith(f"{row['old']}: ")
    assert f"already in {bucket} for 1 node(s)" in err, err[-5000:]
    assert s3_front.bundle_gets == 4 and s3_front.tamper_bundles == 0
    # The other three converged and ran their probes on themselves; each round is recorded as
    # a bootstrap-pull run, and the round whose every node converged as a verify-quick run too
    # (the first round's totals are left out of the JSON: a node of it failed).
    assert result["bootstrap"]["ok"] is True and len(result["nodes"]) == 3
    assert "verify" not in result["bootstrap"]["pull"]
    ran = [line for line in err.splitlines() if line.endswith("(probes run on the node)")]
    assert [line.split(":")[0].strip() for line in ran] == [row["new"]], err[-5000:]
    status = json.loads(run_cli("status", "ps3", "-o", "json", check=True).stdout)
    runs = [(r["kind"], r["ok"]) for r in status["runs"]]
    assert runs.count(("bootstrap-pull", False)) == 1 and runs.count(("bootstrap-pull", True)) == 1, runs
    assert [kind for kind, _ in runs].count("verify-quick") == 1, runs
    # No request of the nodes was refused by S3 (each wrote under its own prefix), and the
    # reports, recorded here, are gone from the bucket; the bundle stays for the next round.
    assert s3_front.refused == []
    import boto3

    keys = [o["Key"] for o in boto3.client("s3", region_name="us-east-1").list_objects_v2(
        Bucket=bucket).get("Contents", [])]
    assert keys == [f"gpuprov/ps3/bundle/{sha}.tar.gz"], keys
    # `provision --via pull`: the same channel converges the three nodes again, each on itself
    # (the spot play: nothing left to change), recorded as a provision-pull run; the reports
    # are gone from the bucket again.
    proc = run_cli("provision", "ps3", "--via", "pull", "--tags", "spot", "-o", "json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    again = json.loads(proc.stdout)
    assert again["ok"] is True and sorted(again["hosts"]) == sorted(n["name"] for n in result["nodes"]), again
    assert all(h["changed"] == 0 and h["tasks"] > 5 for h in again["hosts"].values()), again["hosts"]
    assert f"in {bucket} for 3 node(s)" in proc.stderr and "pull agent handed over SSH to 3 node(s)" in proc.stderr
    runs = [(r["kind"], r["ok"]) for r in json.loads(run_cli("status", "ps3", "-o", "json", check=True).stdout)["runs"]]
    assert ("provision-pull", True) in runs, runs
    # `patch --via pull --check`: the plan of a roll through the same channel, each node running
    # a patch's bundle (patch.yml in check mode) fetched from the bucket and reporting through
    # its objects. The nodes ran the spot play alone, so their apt sources lack the component
    # of this host's CPU microcode (the preflight adds it): each node's own run says so, and the
    # plan fails on each, by name, as push's would (a plan read from a node's patch report, on
    # nodes that have the sources: tests/e2e/test_pull_e2e.py).
    package = "intel-microcode" if "GenuineIntel" in Path("/proc/cpuinfo").read_text() else "amd64-microcode"
    proc = run_cli("patch", "ps3", "--microcode", "--via", "pull", "--check", "-o", "json", timeout=600)
    assert proc.returncode == 1, proc.stderr[-5000:]
    planned = json.loads(proc.stdout)["hosts"]
    assert sorted(planned) == sorted(n["name"] for n in result["nodes"]), planned
    assert all(f"no {package} in the apt sources of the node" in (h.get("plan_error") or "")
               for h in planned.values()), planned
    assert f"uploaded to {bucket} for 3 node(s)" in proc.stderr  # a bundle of its own: a patch's
    kinds = [r["kind"] for r in json.loads(run_cli("status", "ps3", "-o", "json", check=True).stdout)["runs"]]
    assert {"patch-check", "patch-pull-plan"} <= set(kinds), kinds
    assert s3_front.refused == []
    keys = [o["Key"] for o in boto3.client("s3", region_name="us-east-1").list_objects_v2(
        Bucket=bucket).get("Contents", [])]
    assert all("/bundle/" in k for k in keys), keys
    proc = run_cli("down", "ps3", "--yes", timeout=600)
    assert proc.returncode == 0 and f"S3 bucket {bucket} deleted ({len(keys)} object(s))" in proc.stderr, \
        proc.stderr[-3000:]
    assert instances("ps3") == [] and ec2.containers() == [] and _buckets() == []
