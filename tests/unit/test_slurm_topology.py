"""topology.conf from where the nodes are (gpuprov.slurm.topology): EC2's network nodes on the
published DescribeInstanceTopology answer, placement groups, zones, and what is never written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.slurm import topology
from gpuprov.slurm.topology import Place

REC = Path(__file__).parents[1] / "fixtures" / "recordings" / "ec2-instance-topology-published"
ANSWER = json.loads((REC / "describe-instance-topology.json").read_text())
NAMES = {"i-1111111111example": "c-node-1", "i-2222222222example": "c-node-2",
         "i-444444444example": "c-node-3", "i-3333333333example": "c-node-4"}


def test_the_published_answer_makes_a_tree_of_its_network_nodes() -> None:
    network = topology.from_instance_topology(ANSWER, NAMES)
    assert network["c-node-1"] == ("nn-1111111111example", "nn-2222222222example", "nn-3333333333example")
    places = [Place(node, network[node], zone="us-west-2a") for node in sorted(NAMES.values())]
    lines = topology.conf_lines(topology.switches("c", places))
    assert lines == [
        # two top nodes (c-node-4 is in another zone): one switch above both
        "SwitchName=c-top Switches=nn-1111111111example,nn-1212121212example",
        "SwitchName=nn-1111111111example Switches=nn-2222222222example,nn-5434334334example",
        "SwitchName=nn-1212121212example Switches=nn-1211122211example",
        "SwitchName=nn-2222222222example Switches=nn-3333333333example",
        "SwitchName=nn-5434334334example Switches=nn-1235301234example",
        "SwitchName=nn-1211122211example Switches=nn-1311133311example",
        # the two p4d.24xlarge share their bottom node: `--switches=1` keeps a job on them
        "SwitchName=nn-3333333333example Nodes=c-node-1,c-node-2",
        "SwitchName=nn-1235301234example Nodes=c-node-3",
        "SwitchName=nn-1311133311example Nodes=c-node-4",
    ]


def test_without_network_nodes_placement_groups_then_zones_make_the_switches() -> None:
    places = [Place("c-node-1", group="gpuprov-c-us-east-1a", zone="us-east-1a"),
              Place("c-node-2", group="gpuprov-c-us-east-1a", zone="us-east-1a"),
              Place("c-node-3", zone="us-east-1b")]
    assert topology.conf_lines(topology.switches("c", places)) == [
        "SwitchName=c-top Switches=pg-gpuprov-c-us-east-1a,zone-us-east-1b",
        "SwitchName=pg-gpuprov-c-us-east-1a Nodes=c-node-1,c-node-2",
        "SwitchName=zone-us-east-1b Nodes=c-node-3",
    ]
    # local nodes: one switch, no top above it
    local = [Place("d-node-1", zone="local"), Place("d-node-2", zone="local")]
    assert topology.conf_lines(topology.switches("d", local)) == ["SwitchName=zone-local Nodes=d-node-1,d-node-2"]
    assert topology.switches("d", []) == []


def test_a_name_that_would_be_syntax_is_never_written() -> None:
    places = [Place("c-node-1", ("nn-1", "nn-2 Nodes=evil"), group="pg\nSwitchName=x", zone="z one"),
              Place("c-node-2", ("nn-1", "nn-3")),
              Place("bad node", zone="local")]
    lines = topology.conf_lines(topology.switches("c", places))
    # c-node-1's chain and group are refused whole: it falls to a zone switch of its own ("local")
    assert dict(line.split(" ", 1) for line in lines) == {
        "SwitchName=c-top": "Switches=nn-1,zone-local", "SwitchName=nn-1": "Switches=nn-3",
        "SwitchName=zone-local": "Nodes=c-node-1", "SwitchName=nn-3": "Nodes=c-node-2"}
    assert all("\n" not in line and "evil" not in line and "bad" not in line for line in lines)
    # an answer's other shapes are left, not guessed
    assert topology.from_instance_topology({"Instances": [{"InstanceId": "i-1", "NetworkNodes": "nn-1"}]},
                                           {"i-1": "n1"}) == {}


# --- the role's side: topology.conf and slurm.conf's plugin line ---------------------------------
def _role():
    from gpuprov import paths

    return paths.role_module("gpuprov_slurm_topology_rules", "slurm", "filter_plugins", "gpuprov_slurm_topology.py")


def _description(switches: list[dict]) -> dict:
    node = {"cpus": 8, "sockets": 1, "cores_per_socket": 8, "threads_per_core": 1, "memtotal_mb": 32000,
            "gpus": 0, "partition": "p"}
    return {"cluster_name": "c", "controller": "c-node-1", "controller_addr": "10.0.0.5",
            "nodes": [{**node, "name": f"c-node-{i}", "addr": f"10.0.0.{4 + i}"} for i in (1, 2, 3)],
            "topology": switches}


def test_the_role_writes_what_gpuprov_builds_and_names_the_plugin_in_slurm_conf() -> None:
    from gpuprov.slurm import conf

    places = [Place("c-node-1", group="g1"), Place("c-node-2", group="g1"), Place("c-node-3", group="g2")]
    built = [{"name": sw.name, "nodes": sw.nodes, "switches": sw.switches} for sw in topology.switches("c", places)]
    text = _role().topology_conf(_description(built))
    assert text.splitlines()[1:] == topology.conf_lines(topology.switches("c", places))
    assert "TopologyPlugin=topology/tree" in conf.slurm_conf(_description(built)).splitlines()
    assert not any(line.startswith("TopologyPlugin") for line in conf.slurm_conf(_description([])).splitlines())


def test_the_role_refuses_a_topology_it_cannot_write_safely() -> None:
    role = _role()
    leaf = {"name": "s1", "nodes": ["c-node-1", "c-node-2", "c-node-3"]}
    for bad, words in (
        ([{"name": "s1 Nodes=x", "nodes": ["c-node-1"]}], "a switch needs a name"),
        ([{**leaf, "nodes": ["c-node-1", "c-node-2", "c-node-3", "c-node-9"]}], "c-node-9 is no node"),
        ([{**leaf, "nodes": ["c-node-1", "c-node-2"]}], "c-node-3 under no switch"),
        ([leaf, {"name": "s2", "nodes": ["c-node-1"]}], "c-node-1 is under more than one switch"),
        ([leaf, {"name": "top", "switches": ["s9"]}], "s9 is no switch"),
        ([{"name": "a", "switches": ["b"], "nodes": ["c-node-1", "c-node-2", "c-node-3"]},
          {"name": "b", "switches": ["a"]}], "under itself"),
        ([leaf, leaf], "named twice"),
        ([{**leaf, "nodes": ["c-node-1\nSwitchName=x"]}], "expected a list of names"),
    ):
        with pytest.raises(role.SlurmTopologyError, match=words):
            role.topology_conf(_description(bad))
