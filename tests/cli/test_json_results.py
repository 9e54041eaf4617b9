"""`provision`, `verify`, `patch`, `status`, `settings` and `list` with `-o json`, end to end
through the CLI on a static cluster, with Ansible, the probes and the SSH check replaced by
fakes: each document is what docs/json-output.md says, and the exit codes follow `ok`.
(The real thing, with real nodes, is tests/e2e.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuprov import ssh
from gpuprov.ansible import runner
from gpuprov.ansible.runner import PlaybookResult
from gpuprov.cli.app import main
from gpuprov.core import patch as patching
from gpuprov.probes import run as probes
from gpuprov.state import NodeRecord, Store
from tests.json_doc import _normal, _paths, documented

NODES = ("n1", "n2", "n3")


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), json.loads(out) if out.strip() else None, err


def invoke_text(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def assert_documented(command: str, data: Any) -> None:
    doc = documented()[command]
    found = {_normal(p) for p in _paths(data)}
    # Map keys (node and setting names) are names, not fields; spec and stack are free-form.
    for name in (*NODES, "apt_proxy"):
        found = {p.replace(f".{name}", ".<>") for p in found}
    found = {p for p in found if not p.endswith(".<>") and not p.startswith(("spec.", "stack."))}
    assert found - set(doc) == set(), command


@pytest.fixture
def cluster(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for var in ("GPUPROV_APT_PROXY", "GPUPROV_ARTIFACT_MIRROR", "GPUPROV_REGISTRY_MIRROR",
                "GPUPROV_CONTAINER_TOOLKIT_REPO", "GPUPROV_CONTAINER_TOOLKIT_REPO_FPR",
                "GPUPROV_REGISTRY_DIGESTS"):
        monkeypatch.delenv(var, raising=False)
    store = Store()
    store.create_cluster("rack", "static", {"instance_type": "g5.xlarge", "options": {"settings": {
        "apt_proxy": {"value": "http://10.0.0.5:3142", "from": "GPUPROV_APT_PROXY"}}}})
    store.replace_nodes("rack", [
        NodeRecord(name=n, id=n, address=f"192.0.2.{i}", ssh_port=22, user="root", state="reachable",
                   zone="static", instance_type="g5.xlarge") for i, n in enumerate(NODES, 1)])
    # n3 never answers SSH.
    monkeypatch.setattr(ssh, "unreachable_nodes", lambda nodes, key, known: {
        n.name: "ssh: connect to host 192.0.2.3 port 22: Connection refused" for n in nodes if n.name == "n3"})
    return "rack"


def _fake_playbook(reports: dict[str, dict[str, Any]], failing: frozenset[str] = frozenset()) -> Any:
    """A run_playbook that 'runs' on the hosts given: 5 ok, 1 changed each (failing hosts: 1
    failed), and the patch play's report per host as ansible-runner's job events hold it."""
    def run(playbook: Path, files: Any, hosts: list[str], run_dir: Path, **kw: Any) -> PlaybookResult:
        artifacts = run_dir / "artifacts" / "ansible"
        (artifacts / "job_events").mkdir(parents=True)
        for i, host in enumerate(hosts):
            event = {"event": "runner_on_ok", "event_data": {
                "host": host, "task": patching.REPORT_TASK, "res": {"msg": reports.get(host, {})}}}
            (artifacts / "job_events" / f"{i}.json").write_text(json.dumps(event))
        stats = {h: {"ok": 5, "changed": 0 if kw.get("check") else 1, "failed": int(h in failing),
                     "unreachable": 0, "tasks": 6} for h in hosts}
        errors = {h: "Install the driver: no candidate" for h in hosts if h in failing}
        return PlaybookResult(ok=not errors, rc=2 if errors else 0, status="successful", hosts=stats,
                              errors=errors, artifact_dir=artifacts)
    return run


def test_provision_json_reports_the_unreachable_node_once(capsys, cluster, monkeypatch) -> None:
    monkeypatch.setattr(runner, "run_playbook", _fake_playbook({}, failing=frozenset({"n2"})))
    code, data, err = invoke(capsys, "provision", cluster, "-o", "json")
    assert code == 1, err
    assert data["ok"] is False and set(data["hosts"]) == set(NODES)
    assert data["hosts"]["n1"] == {"ok": 5, "changed": 1, "failed": 0, "unreachable": 0, "tasks": 6}
    assert data["hosts"]["n3"] == {"ok": 0, "changed": 0, "failed": 0, "unreachable": 1, "tasks": 0}
    assert data["errors"] == {"n2": "Install the driver: no candidate",
                              "n3": "unreachable: ssh: connect to host 192.0.2.3 port 22: Connection refused"}
    assert_documented("provision", data)
    code, status, _ = invoke(capsys, "status", cluster, "-o", "json")
    assert code == 0 and status["failed_step"] == "bootstrap"
    assert status["runs"][0]["kind"] == "provision" and status["runs"][0]["ok"] is False
    assert status["settings"] == {"apt_proxy": {"value": "http://10.0.0.5:3142", "from": "GPUPROV_APT_PROXY"}}
    assert_documented("status", status)


def test_verify_json_counts_rows_and_fails_on_the_unreachable_node(capsys, cluster, monkeypatch) -> None:
    def run_probes(inventory: Path, cfg: Path, hosts: list[str], expect: Any, run_dir: Path,
                   **kw: Any) -> dict[str, list[dict[str, str]]]:
        return {h: [{"probe": "gpu_count", "status": "skip", "detail": "no GPU in a test"},
                    {"probe": "held_packages", "status": "pass", "detail": "ok"}] for h in hosts}

    monkeypatch.setattr(probes, "run_probes", run_probes)
    code, data, err = invoke(capsys, "verify", cluster, "-o", "json")
    assert code == 1, err
    assert data["summary"] == {"pass": 2, "fail": 1, "skip": 2}
    (row,) = data["hosts"]["n3"]
    assert row["probe"] == "reachable" and row["status"] == "fail" and row["detail"].startswith("unreachable: ")
    assert_documented("verify", data)


def test_patch_json_rolls_the_reachable_nodes_and_keeps_the_lock(capsys, cluster, monkeypatch) -> None:
    plan = {"n1": {"kernel_upgradable": ["linux-image-amd64"], "before": {"linux-image-amd64": "6.1.1"},
                   "after": {"linux-image-amd64": "6.1.2"}, "rebooted": False,
                   "reboot_skipped": "--no-reboot"},
            "n2": {"kernel_upgradable": [], "before": {}, "after": {}}}
    monkeypatch.setattr(runner, "run_playbook", _fake_playbook(plan))
    monkeypatch.setattr(probes, "run_probes", lambda inv, cfg, hosts, *a, **kw: {
        h: [{"probe": "gpu_count", "status": "pass", "detail": "ok"}] for h in hosts})
    code, data, err = invoke(capsys, "patch", cluster, "--kernel", "--no-reboot", "-o", "json")
    assert code == 1, err  # n3 was not reached: the lock does not move
    assert data["batches"] == [["n1"]]
    n1, n2, n3 = (data["hosts"][n] for n in NODES)
    assert n1 == {"status": "patched", "changed": 1, "rebooted": False, "plan": ["linux-image-amd64 -> newest"],
                  "moved": ["linux-image-amd64 6.1.1 -> 6.1.2"], "reboot_skipped": "--no-reboot"}
    assert n2 == {"status": "unchanged", "changed": 0, "rebooted": False, "plan": []}
    assert n3["status"] == "not-started" and n3["error"] == n3["plan_error"] and n3["plan"] == []
    assert data["lock"]["from"] == Store().get_cluster(cluster).lock["hash"]
    assert_documented("patch", data)
    code, check, _ = invoke(capsys, "patch", cluster, "--kernel", "--check", "-o", "json")
    assert code == 1 and check["batches"] == [["n1"]] and check["hosts"]["n2"]["status"] == "unchanged"
    assert check["hosts"]["n1"]["status"] == "not-started" and "moved" not in check["hosts"]["n1"]


def test_list_and_settings_json(capsys, cluster) -> None:
    code, rows, _ = invoke(capsys, "list", "-o", "json")
    assert code == 0 and [(r["name"], r["nodes"], r["state"]) for r in rows] == [("rack", 3, "launching")]
    assert_documented("list", rows)
    code, data, _ = invoke(capsys, "settings", cluster, "--set", "apt_proxy=", "-o", "json")
    assert code == 0 and data == {"cluster": cluster, "settings": {}, "changed": ["apt_proxy"]}
    assert_documented("settings", data)


def test_provision_check_exits_3_with_changes_pending_and_names_them(capsys, cluster, monkeypatch) -> None:
    """Issue 53: `--check` exits 0 with nothing to change, 3 with changes pending (2 is bad
    input), 1 where a node failed; -o json names each task that would change per node. (The
    counting itself runs the real ansible-playbook: tests/unit/test_check_would_change.py.)"""
    monkeypatch.setattr(ssh, "unreachable_nodes", lambda nodes, key, known: {})

    def planned(would: dict[str, list[str]]):
        def run(playbook: Path, files: Any, hosts: list[str], run_dir: Path, **kw: Any) -> PlaybookResult:
            assert kw.get("check") is True
            stats = {h: {"ok": 5, "changed": len(would.get(h, [])), "failed": 0, "unreachable": 0, "tasks": 6}
                     for h in hosts}
            return PlaybookResult(ok=True, rc=0, status="successful", hosts=stats, errors={},
                                  artifact_dir=run_dir, would_change=would)
        return run

    monkeypatch.setattr(runner, "run_playbook", planned({"n2": ["Hold NVIDIA packages"]}))
    code, data, err = invoke(capsys, "provision", cluster, "--check", "--full", "-o", "json")
    assert code == 3, err
    assert data["ok"] is True and data["would_change"] == {"n2": ["Hold NVIDIA packages"]}
    assert data["hosts"]["n2"]["changed"] == 1
    assert_documented("provision", data)
    monkeypatch.setattr(runner, "run_playbook", planned({}))
    code, data, err = invoke(capsys, "provision", cluster, "--check", "--full", "-o", "json")
    assert code == 0 and "would_change" not in data, err
    code, out, _ = invoke_text(capsys, "provision", cluster, "--check", "--full")
    assert code == 0 and "would change" not in out
    monkeypatch.setattr(runner, "run_playbook", planned({"n1": ["A managed file", "Hold NVIDIA packages"]}))
    code, out, _ = invoke_text(capsys, "provision", cluster, "--check", "--full")
    assert code == 3 and "n1: would change (2): A managed file; Hold NVIDIA packages" in out, out


def test_a_provision_that_changed_nothing_keeps_the_cluster_verified(capsys, cluster, monkeypatch) -> None:
    """Issue 53, section 2: a no-op `provision` leaves a verified cluster verified; one that
    changed a node makes it bootstrapped and says `verify` is the next step. So does a no-op on
    a node that held no manifest before the run (new to the cluster, or its last whole run
    failed): nothing proved it since it was converged."""
    from gpuprov.manifest import record

    monkeypatch.setattr(ssh, "unreachable_nodes", lambda nodes, key, known: {})
    monkeypatch.setattr(record, "records", lambda c: {n: {"fixture": "a manifest held"} for n in NODES})

    def converged(changed: int):
        def run(playbook: Path, files: Any, hosts: list[str], run_dir: Path, **kw: Any) -> PlaybookResult:
            stats = {h: {"ok": 5, "changed": changed, "failed": 0, "unreachable": 0, "tasks": 6} for h in hosts}
            return PlaybookResult(ok=True, rc=0, status="successful", hosts=stats, errors={}, artifact_dir=run_dir)
        return run

    Store().set_cluster_state(cluster, "verified")
    monkeypatch.setattr(runner, "run_playbook", converged(0))
    code, _, err = invoke(capsys, "provision", cluster, "--full", "-o", "json")
    assert code == 0 and "next: gpuprov verify" not in err, err
    assert Store().get_cluster(cluster).state == "verified"
    monkeypatch.setattr(runner, "run_playbook", converged(1))
    code, _, err = invoke(capsys, "provision", cluster, "--full", "-o", "json")
    assert code == 0 and f"next: gpuprov verify {cluster}" in err, err
    assert Store().get_cluster(cluster).state == "bootstrapped"
    Store().set_cluster_state(cluster, "verified")
    monkeypatch.setattr(record, "records", lambda c: {n: {"fixture": "a manifest held"} for n in NODES[:-1]})
    monkeypatch.setattr(runner, "run_playbook", converged(0))
    code, _, err = invoke(capsys, "provision", cluster, "--full", "-o", "json")
    assert code == 0 and f"next: gpuprov verify {cluster}" in err, err
    assert Store().get_cluster(cluster).state == "bootstrapped"
