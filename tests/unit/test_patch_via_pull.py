"""`patch --via pull`'s parts on this machine: the bundle of a patch's round (format 2, its
playbook and check mode, nothing else runnable), the agent's reading of it (an agent refuses a
playbook it does not know; check mode reaches Ansible), the one task result that leaves a node
(the patch report: the callback's name for it is the controller's, and its check bounds it),
the refusals before anything changes, and how a batch's report is read. The roll on real
nodes, through the real agent: tests/e2e/test_pull_e2e.py."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

from gpuprov.core import patch_plan, patch_pull
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.pull import bundle as bundle_mod
from gpuprov.pull.reports import BadReport, check_report
from gpuprov.results.shapes import HostStats, ProvisionResult
from tests.unit.node_programs import load_agent

PROFILES = {"docker-node": {"hostvars": {"gpuprov_expected_gpus": 0}, "expect": {}}}


def _manifest(data: bytes) -> dict[str, Any]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return json.loads(member.read())


def _build(**kw: Any) -> bundle_mod.Bundle:
    return bundle_mod.build(lock={"hash": "abc123"}, extravars={}, group="gpuprov_nodes", group_vars={},
                            profiles=PROFILES, **kw)


def test_a_patch_rounds_bundle_names_its_playbook_and_check_mode_and_is_format_2() -> None:
    site = _manifest(_build().data)
    assert site["format"] == 1 and "playbook" not in site and "check" not in site  # as before: same bytes
    plan = _manifest(_build(playbook="patch.yml", check=True).data)
    assert (plan["format"], plan["playbook"], plan["check"]) == (2, "patch.yml", True)
    batch = _build(playbook="patch.yml")
    assert _manifest(batch.data)["check"] is False and batch.sha256 != _build(playbook="patch.yml", check=True).sha256
    with pytest.raises(GpuprovError, match=re.escape("runs one of site.yml, patch.yml, not '../../etc/x.yml'")):
        _build(playbook="../../etc/x.yml")


def test_the_agent_runs_the_bundles_playbook_only_from_its_list_and_check_mode_when_asked(
        tmp_path: Path, monkeypatch) -> None:
    agent = load_agent("gpuprov_pull_agent_patch")
    assert agent.PLAYBOOKS == bundle_mod.PLAYBOOKS and set(agent.FORMATS) == {bundle_mod.FORMAT, bundle_mod.PATCH_FORMAT}
    assert agent.playbook(tmp_path, {}) == tmp_path / "site" / "playbooks" / "site.yml"
    for bad in ("../site.yml", "/etc/passwd", "other.yml", 3):
        with pytest.raises(RuntimeError, match=re.escape("this agent runs site.yml, patch.yml")):
            agent.playbook(tmp_path, {"playbook": bad})
    ran: list[list[str]] = []

    def run(cmd, until, what, **_kw):  # the agent runs the plays within the run's budget
        ran.append(cmd)
        return 0

    monkeypatch.setattr(agent, "within", run)
    log = tmp_path / "log"
    agent.converge(tmp_path, {"playbook": "patch.yml", "check": True}, {}, log)
    agent.converge(tmp_path, {"playbook": "patch.yml", "check": "yes"}, {}, log)  # only true itself
    assert ran[0][-2:] == [str(tmp_path / "site" / "playbooks" / "patch.yml"), "--check"]
    assert ran[1][-1] == str(tmp_path / "site" / "playbooks" / "patch.yml")


def _report_batch(res: dict[str, Any]) -> bytes:
    return json.dumps({"from": 0, "events": [{"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": patch_plan.REPORT_TASK, "role": "node_patch", "res": res}}]}).encode()


def test_the_patch_report_is_the_one_result_that_leaves_a_node_and_is_bounded() -> None:
    callback = (Path(bundle_mod.NODE_DIR) / "gpuprov_pull.py").read_text()
    assert f'REPORT_TASK = "{patch_plan.REPORT_TASK}"' in callback  # the name the controller reads
    report = {"before": {"intel-microcode": "3.20250512.1~deb12u1"}, "after": {}, "kernel_upgradable": [],
              "cpu_vendor": "intel", "reboot_reasons": [], "rebooted": False, "gpus": 0, "container": True,
              # a CUDA move's fields (`patch --cuda`): the line before and after, what left
              "cuda_line": "11.8", "cuda_line_after": "13.0", "cuda_old_prefix": "/usr/local/cuda-11.8",
              "cuda_leaving": {"cuda-toolkit-11-8": "11.8.0-1", "libnccl2": "2.16.5-1+cuda11.8"}}
    _, events = check_report(_report_batch({"changed": False, "report": report}))
    assert events[0]["event_data"]["res"]["report"] == report
    for bad, why in (({"x": {"a": {"b": "c"}}}, "a string expected"), ({"x": ["a"] * 501}, "a list or map of"),
                     ({"x": 1.5}, "a list or map of"), ({"x": "y" * 5000}, "characters"),
                     ("not a map", "an object of at most 64 fields")):
        with pytest.raises(BadReport, match=why):
            check_report(_report_batch({"report": bad}))


def test_via_pull_is_refused_with_onto_image_and_an_unknown_via() -> None:
    with pytest.raises(BadInput, match="--onto-image replaces the nodes"):
        patch_plan.request(microcode=True, via="pull", onto_image="newest")
    with pytest.raises(BadInput, match="--via is push or pull"):
        patch_plan.request(microcode=True, via="ssh")
    assert patch_plan.request(microcode=True, via="pull").via == "pull"


def test_a_slurm_cluster_is_refused_before_any_node_is_handed_anything(gpuprov_home) -> None:
    from gpuprov.providers import get
    from gpuprov.state import Store

    store = Store()
    slurm = store.create_cluster("s1", "docker", {"options": {"scheduler": "slurm"}})
    with pytest.raises(BadInput, match="does not patch a cluster that runs Slurm, and s1 does"):
        patch_pull.begin(store, slurm, get("docker"), None, [], None)
    plain = store.create_cluster("p1", "docker", {})
    assert patch_pull.begin(store, plain, get("docker"), None, [], None).cluster is plain


def test_a_batch_round_reads_each_nodes_report_rows_and_stats_and_says_why_no_reboot(monkeypatch) -> None:
    """What the controller's pull round gave (its ProvisionResult and each node's outcome)
    read as push's run is: stats, errors, the patch report, the probe rows; the batch runs
    with reboots off, and a reboot the play could not make is said to be pull's."""
    seen: dict[str, Any] = {}

    def existing(run, cluster, nodes, kind, *, plays, outcome):
        seen.update(kind=kind, plays=plays, nodes=[n for n in nodes])
        outcome.update({"n1": {"report": {"reboot_skipped": "reboot not allowed (node_patch_reboot false)"},
                               "probes": [{"probe": "p", "status": "pass", "detail": ""}]},
                        "n2": {"why": "the patch play ended with exit 2"}})
        return ProvisionResult(cluster="c", ok=False, hosts={"n1": HostStats.of({"ok": 9, "changed": 2, "tasks": 9}),
                                                             "n2": HostStats.of({"failed": 1})},
                               errors={"n2": "the patch play ended with exit 2"})

    monkeypatch.setattr(patch_pull.controller, "existing", existing)
    roll = type("Roll", (), {"pull": type("R", (), {"cluster": "rec"})(), "by_name": {"n1": "N1", "n2": "N2"},
                             "lock": {"hash": "new"}, "old": {"hash": "old"}, "extravars": {"gpuprov_patch_reboot": True}})()
    played = patch_pull.batch_round(roll, ["n1", "n2"])
    assert seen["kind"] == patch_pull.BATCH_KIND and seen["nodes"] == ["N1", "N2"]
    assert seen["plays"].lock == {"hash": "new"} and seen["plays"].check is False
    assert seen["plays"].extravars["gpuprov_patch_reboot"] is False and seen["plays"].playbook == "patch.yml"
    assert played.hosts["n1"]["changed"] == 2 and played.errors == {"n2": "the patch play ended with exit 2"}
    assert played.reports == {"n1": {"reboot_skipped": patch_pull.NO_REBOOT}}
    assert played.rows == {"n1": [{"probe": "p", "status": "pass", "detail": ""}], "n2": []}
    plan = patch_pull.plan_round(roll)
    assert seen["kind"] == patch_pull.PLAN_KIND and seen["plays"].check is True and seen["plays"].lock == {"hash": "old"}
    assert seen["plays"].extravars["gpuprov_patch_reboot"] is True and plan.reports["n1"]["reboot_skipped"].startswith(
        "reboot not allowed")
