"""The controller's side of the manifest: the inputs' digest, the record in the state, and the
rule that a node gets no Ansible run only when everything agrees (anything else, a doubt
included, is a full run)."""

from __future__ import annotations

import pytest

from gpuprov.manifest import record, remote
from gpuprov.state import NodeRecord, Store

NODE = NodeRecord(name="c-node-1", id="abc123", address="127.0.0.1", ssh_port=32768, user="gpuprov",
                  state="running")
VARS = {"gpuprov_stack": {"driver": "580.159.04", "hash": "684b1af6a3a9"}, "gpuprov_artifact_mirror": "http://m"}
HOST = {"ansible_host": "127.0.0.1", "ansible_port": 32768, "ansible_user": "gpuprov",
        "gpuprov_instance_type": "docker-node", "gpuprov_expected_gpus": 0}
ME = remote.identity()


def digest(variables=VARS, host=HOST, scope=record.SITE, me=ME) -> str:
    return record.inputs_digest(variables, host, scope, me)


def test_the_inputs_digest_moves_with_what_reaches_the_plays() -> None:
    base = digest()
    assert digest() == base
    assert digest({**VARS, "gpuprov_stack": {**VARS["gpuprov_stack"], "driver": "580.160.01"}}) != base
    assert digest({**VARS, "gpuprov_artifact_mirror": "http://other"}) != base
    assert digest(host={**HOST, "gpuprov_expected_gpus": 8}) != base
    assert digest(scope="driver,preflight") != base
    assert digest(me={**ME, "gpuprov": "0.0.9"}) != base


def test_how_a_node_is_reached_is_not_an_input() -> None:
    """A local node's SSH port moves when its container restarts: that is no reason to converge."""
    assert digest(host={**HOST, "ansible_port": 40000, "ansible_host": "10.0.0.9"}) == digest()


def test_the_plays_digest_covers_the_roles_and_playbooks(tmp_path, monkeypatch) -> None:
    from gpuprov import paths

    for rel in ("playbooks/site.yml", "roles/r/tasks/main.yml", "roles/r/molecule/default/converge.yml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("---\n")
    monkeypatch.setattr(paths, "playbooks_dir", lambda: tmp_path / "playbooks")
    monkeypatch.setattr(paths, "roles_dir", lambda: tmp_path / "roles")
    record.plays_digest.cache_clear()
    try:
        first = record.plays_digest()
        (tmp_path / "roles/r/molecule/default/converge.yml").write_text("--- # a scenario is not a play\n")
        assert record.plays_digest.__wrapped__() == first
        (tmp_path / "roles/r/tasks/main.yml").write_text("--- # changed\n")
        assert record.plays_digest.__wrapped__() != first
    finally:
        record.plays_digest.cache_clear()


def test_scope_is_every_play_or_the_tags_in_order() -> None:
    assert record.scope_of(None) == record.scope_of([]) == "site"
    assert record.scope_of(["preflight", "driver", "driver"]) == "driver,preflight"


REC = {"id": NODE.id, "digest": "d" * 64, "inputs": digest(), "scope": "site", "items": 40}
HELD = {"state": "held", "digest": "d" * 64, "items": 40, "drift": []}


def test_held_only_when_everything_agrees() -> None:
    v = record.verdict(NODE, REC, HELD, None, digest(), "site")
    assert (v.run, v.state, v.line) == (False, "held", "unchanged (manifest held, 40 items checked)")


@pytest.mark.parametrize(("rec", "answer", "error", "inputs", "scope", "state"), [
    (None, HELD, None, digest(), "site", "no manifest recorded"),
    ({**REC, "id": "other"}, HELD, None, digest(), "site", "node re-created since its manifest"),
    (REC, HELD, None, digest(), "driver,preflight", "manifest covers site, not driver,preflight"),
    (REC, None, "Connection refused", digest(), "site", "manifest not checked"),
    (REC, {**HELD, "state": "drifted", "drift": ["x: sha256 changed"]}, None, digest(), "site", "drifted"),
    (REC, {**HELD, "state": "other-version"}, None, digest(), "site", "manifest other-version"),
    (REC, {**HELD, "state": "missing"}, None, digest(), "site", "manifest missing"),
    (REC, {**HELD, "digest": "e" * 64}, None, digest(), "site", "manifest replaced"),
    (REC, HELD, None, digest(scope="x"), "site", "inputs changed"),
])
def test_any_doubt_is_a_full_run(rec, answer, error, inputs, scope, state) -> None:
    v = record.verdict(NODE, rec, answer, error, inputs, scope)
    assert v.run and v.state == state and v.line.startswith(f"full run ({state}")


def test_the_record_lives_in_the_clusters_state_and_a_missing_one_is_none(gpuprov_home) -> None:
    store = Store()
    store.create_cluster("c", "docker", {"options": {"settings": {}}})
    assert record.records(store.get_cluster("c")) == {}
    record.write(store, "c", {"c-node-1": REC, "c-node-2": {**REC, "id": "n2"}})
    record.write(store, "c", {"c-node-2": None})
    cluster = store.get_cluster("c")
    assert record.records(cluster) == {"c-node-1": REC}
    assert cluster.spec["options"] == {"settings": {}}  # the rest of the record is kept


def test_the_play_runs_on_the_nodes_that_did_not_hold_and_slurm_takes_them_all() -> None:
    from gpuprov.manifest import steps

    nodes = [NODE, NodeRecord(name="c-node-2", id="n2", address="127.0.0.1", ssh_port=32769, user="gpuprov",
                              state="running")]
    held = record.Verdict("held", 40, (), False)
    drifted = record.Verdict("drifted", 40, ("x: sha256 changed",), True)
    said: list[str] = []
    assert steps.to_run(nodes, {}, slurm=False, say=said.append) == nodes and said == []  # --full, up
    assert steps.to_run(nodes, {"c-node-1": held, "c-node-2": drifted}, slurm=False, say=said.append) == nodes[1:]
    assert said == ["  c-node-1: unchanged (manifest held, 40 items checked)",
                    "  c-node-2: full run (drifted: x: sha256 changed)"]
    assert steps.to_run(nodes, {"c-node-1": held, "c-node-2": drifted}, slurm=True, say=said.append) == nodes
    assert steps.to_run(nodes, {"c-node-1": held, "c-node-2": held}, slurm=True, say=said.append) == []


def test_a_held_node_is_in_the_result_with_nothing_run() -> None:
    from gpuprov.manifest import steps
    from gpuprov.results.shapes import HostStats, ProvisionResult, serialise

    ran = HostStats(ok=80, changed=3, failed=0, unreachable=0, tasks=80)
    outcome = ProvisionResult(cluster="c", ok=True, hosts={"c-node-2": ran}, errors={})
    nodes = [NODE, NodeRecord(name="c-node-2", id="n2", address="a", ssh_port=1, user="u", state="running")]
    found = {"c-node-1": record.Verdict("held", 40, (), False),
             "c-node-2": record.Verdict("drifted", 41, ("x: missing",), True)}
    data = serialise(steps.merged(outcome, nodes, found))
    assert data["hosts"] == {"c-node-1": serialise(steps.NOTHING_RAN), "c-node-2": serialise(ran)}
    assert data["manifest"] == {
        "c-node-1": {"state": "held", "action": "unchanged", "items": 40, "drift": []},
        "c-node-2": {"state": "drifted", "action": "full run", "items": 41, "drift": ["x: missing"]}}
    assert "manifest" not in serialise(steps.merged(outcome, nodes, {}))  # --full, up: as before
