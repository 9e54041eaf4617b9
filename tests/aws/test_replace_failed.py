"""`up --min-count K` when nodes fail their bootstrap, on an EC2 whose instances are real nodes
(tests/aws/ec2_nodes.py, a labelled fixture): each failing node is named, set aside
(terminated, or left running with --keep-failed) and replaced while --retries lasts; the
cluster records each replacement, `status` shows it, and `down` leaves nothing.

The fault is the fixture's ``broken_bootstrap`` (a FIXTURE fault: the Nth instance booted,
counted across launches, gets a read-only /etc/ansible/facts.d, so the first play's first
write there fails); such a node boots, runs cloud-init and hands its host key over like any
other, and fails only its bootstrap.

Which plays run, and why: ``--tags spot`` on on-demand instances, which runs the spot play's
common role on each node (gpuprov_base: the facts directory, the GPU facts script, what the
node is) and skips the watcher (IMDS says on-demand). It is the cheapest play that writes to
every node, which is what the fault needs, and keeps each test to three nodes on this 2-core
machine. ``--health off``: there is no GPU behind these nodes, so the health gate would fail
on every one of them; the health-failure path is held in tests/unit/test_min_count_rounds.py.
"""

from __future__ import annotations

import json

import pytest

from tests.aws import ec2_nodes
from tests.aws.conftest import MOTO_AMI, instances
from tests.aws.helpers import assert_refused, invoke, up
from tests.aws.moto_shim import Shim
from tests.conftest import run_cli

pytestmark = pytest.mark.e2e

# Every zone of the region moto knows (a type is offered in some of them).
ZONES = tuple(f"us-east-1{z}" for z in "abcdef")
LIGHT = ("--type", "g5.xlarge", "--image", MOTO_AMI, "--ssh-cidr", "127.0.0.1/32", "--tags", "spot",
         "--health", "off", "--yes", "-o", "json")


def _nothing_left(name: str, ec2: ec2_nodes.Ec2Nodes) -> None:
    from gpuprov.providers.aws import api, teardown

    assert instances(name) == [] and ec2.containers() == []
    assert teardown.tagged_resources(api.connect("us-east-1"), name) == []


def test_a_node_failing_its_bootstrap_on_short_capacity_is_named_terminated_and_replaced(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes) -> None:
    # Two g5.xlarge left in every zone: no zone has 3, --min-count 2 takes 2; the second fails.
    shim.capacity.update({z: 2 for z in ZONES})
    ec2.broken_bootstrap = {1}
    proc = run_cli("up", "--name", "short", "--count", "3", "--min-count", "2", *LIGHT, timeout=900)
    err = proc.stderr
    assert proc.returncode == 0, err[-4000:]
    assert "launched 2 of 3 (--min-count 2)" in err
    named = [line for line in err.splitlines() if line.startswith("short-node-2: bootstrap failed: ")]
    assert len(named) == 1 and "/etc/ansible/facts.d not writable" in named[0], err[-4000:]
    assert "replacement round 1 of 1: in place of short-node-2, launching the 2 missing node(s)" in err
    assert "launched 1 of 2 (--min-count 2): the cluster has 2 of its 3 node(s)" in err  # 1 left, 1 given back
    assert "the cluster has 2 of its 3 node(s) (--min-count 2); `gpuprov up short` again adds the rest" in err
    result = json.loads(proc.stdout)
    assert result["bootstrap"]["ok"] is True
    # The terminated node's index is free again: its replacement takes its name, not its id.
    (row,) = result["replaced"]
    assert (row["old"], row["new"], row["kept"]) == ("short-node-2", "short-node-2", False)
    assert row["why"] == named[0].split(": ", 1)[1] and row["old_id"] != row["new_id"]
    running = {i["InstanceId"] for i in instances("short")}
    assert running == {n["id"] for n in result["nodes"]} and row["new_id"] in running, running
    assert row["old_id"] not in running and row["old_id"] not in ec2.instances
    # The record: in the spec, in status (JSON and text).
    status = json.loads(run_cli("status", "short", "-o", "json", check=True).stdout)
    assert status["replaced"] == [row] and status["spec"]["replaced"] == [row]
    assert status["kept"] == [] and status["failed_step"] is None and len(status["nodes"]) == 2
    text = run_cli("status", "short", check=True).stdout
    assert row["old_id"] in text and "bootstrap failed" in text, text
    assert run_cli("down", "short", "--yes", timeout=600).returncode == 0
    _nothing_left("short", ec2)


def test_a_node_that_keeps_failing_spends_the_budget_and_below_k_nothing_is_left(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes) -> None:
    ec2.broken_bootstrap = {1, 2}  # the second node and its replacement
    proc = run_cli("up", "--name", "stubborn", "--count", "2", "--min-count", "2", "--retries", "1", *LIGHT,
                   timeout=900)
    err = proc.stderr
    assert proc.returncode == 1, err[-4000:]
    assert sum(line.startswith("stubborn-node-2: bootstrap failed: ") for line in err.splitlines()) == 2, err[-4000:]
    assert "no rounds left (--retries 1): stubborn-node-2 not replaced" in err
    assert "stubborn: 1 of 2 node(s) converged, fewer than --min-count 2" in err
    result = json.loads(proc.stdout)
    assert result["bootstrap"]["ok"] is False and result["nodes"] == []  # a new cluster: rolled back
    assert [(r["old"], r["new"]) for r in result["replaced"]] == [("stubborn-node-2", "stubborn-node-2"),
                                                                  ("stubborn-node-2", None)]
    _nothing_left("stubborn", ec2)
    assert run_cli("status", "stubborn").returncode == 2


def test_keep_failed_leaves_the_node_running_out_of_the_cluster_and_down_removes_it(
        shim: Shim, ec2: ec2_nodes.Ec2Nodes) -> None:
    ec2.broken_bootstrap = {1}
    proc = run_cli("up", "--name", "keep", "--count", "2", "--min-count", "1", "--keep-failed", *LIGHT, timeout=900)
    err = proc.stderr
    assert proc.returncode == 0, err[-4000:]
    result = json.loads(proc.stdout)
    (row,) = result["replaced"]
    # The kept node keeps its index (it still carries the cluster's tag): its replacement is node 3.
    assert (row["old"], row["new"], row["kept"]) == ("keep-node-2", "keep-node-3", True)
    assert [n["name"] for n in result["nodes"]] == ["keep-node-1", "keep-node-3"]
    assert "keep-node-2: kept running for inspection" in err
    running = {i["InstanceId"] for i in instances("keep")}
    assert len(running) == 3 and row["old_id"] in running and row["old_id"] in ec2.instances
    status = json.loads(run_cli("status", "keep", "-o", "json", check=True).stdout)
    assert [(k["name"], k["id"], k["why"]) for k in status["kept"]] == [("keep-node-2", row["old_id"], row["why"])]
    assert [n["name"] for n in status["nodes"]] == ["keep-node-1", "keep-node-3"]
    assert "keep-node-2" not in run_cli("inventory", "keep", check=True).stdout
    # `up` again: the kept node neither counts as a node nor as one too many; nothing launched.
    shim.calls.clear()
    proc = run_cli("up", "--name", "keep", "--count", "2", *LIGHT[:6], "--no-bootstrap", "--yes", "-o", "json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["nodes"]) == 2 and shim.run_calls() == []
    # down removes it with the cluster.
    proc = run_cli("down", "keep", "--yes", timeout=600)
    assert proc.returncode == 0 and "down (3 node(s) removed)" in proc.stderr, proc.stderr[-3000:]
    _nothing_left("keep", ec2)


def test_keep_failed_and_retries_without_min_count_are_refused_before_anything(
        capsys: pytest.CaptureFixture[str], shim: Shim, ami: str) -> None:
    for flags in (["--keep-failed"], ["--retries", "2"]):
        code, out, err = up(capsys, ami, "bad", *flags)
        assert_refused(code, out, err, f"{flags[0]} goes with --min-count K", shim)
    code, out, err = invoke(capsys, "up", "--provider", "docker", "--count", "1", "--keep-failed", "--name", "local",
                            "--yes")
    assert_refused(code, out, err, "--keep-failed goes with --min-count K", shim)
