"""Core reaches providers through their interface only: a provider it has never heard of,
registered under a new name, takes part in `down` and `list` by the abilities it declares."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from gpuprov.console import Console
from gpuprov.core import down, status
from gpuprov.providers import ClusterFiles, ClusterSpec, Orphans, Plan, Provider, Reporter, spec
from gpuprov.state import NodeRecord, Store

NODE = NodeRecord(name="lost-node-1", id="f-1", address="192.0.2.9", ssh_port=22, user="u", state="running")


class FakeProvider(Provider):
    name = "fake"
    display_name = "Fakecloud"
    billable = True

    def __init__(self) -> None:
        self.destroyed: list[str] = []

    def plan(self, spec: ClusterSpec, files: ClusterFiles) -> Plan:
        return Plan(spec=spec, to_create=spec.count, existing=0, billable=True)

    def launch(self, plan: Plan, files: ClusterFiles, report: Reporter) -> list[NodeRecord]:
        return []

    def wait_ready(self, spec, nodes, files, report):
        return nodes

    def describe(self, name, known, files):
        return list(known)

    def terminate(self, name, known, files, report) -> int:
        return len(known)

    def find_orphans(self, name: str, region: str | None) -> Orphans | None:
        if name != "lost":
            return None
        return Orphans(provider=self.name, nodes=(NODE,), found="Fakecloud has 1 node labelled with it",
                       removed="unrecorded fake node(s) removed", region=region)

    def destroy_orphans(self, name: str, orphans: Orphans, report: Reporter) -> int:
        self.destroyed.append(name)
        return len(orphans.nodes)

    def list_tagged_clusters(self, regions, asked):
        return {"kept": {"nodes": 2, "created": "2026-01-01", "region": None},
                "stray": {"nodes": 1, "created": "2026-01-02", "region": None}}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, gpuprov_home: Path) -> FakeProvider:
    module = types.ModuleType("fake_provider_for_tests")
    module.PROVIDER = FakeProvider()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(spec, "PROVIDERS", {"fake": spec.ProviderFacts(module.__name__)})
    return module.PROVIDER  # type: ignore[attr-defined,no-any-return]


def test_down_finds_an_unrecorded_cluster_through_any_provider(fake: FakeProvider) -> None:
    asked: list[str] = []
    result = down.down("lost", console=Console(quiet=True), confirm=lambda q: asked.append(q) or True)
    assert result == {"cluster": "lost", "provider": "fake", "removed": 1}
    assert asked == ["lost: not in state, but Fakecloud has 1 node labelled with it; remove them?"]
    assert fake.destroyed == ["lost"]


def test_down_of_a_name_no_provider_knows(fake: FakeProvider) -> None:
    from gpuprov.errors import BadInput

    with pytest.raises(BadInput, match="unknown cluster 'nowhere'"):
        down.down("nowhere", console=Console(quiet=True))


def test_list_reconciles_with_every_provider_that_lists_by_label(fake: FakeProvider) -> None:
    store = Store()
    store.create_cluster("kept", "fake", {})
    store.create_cluster("gone", "fake", {})
    rows = {r.name: r for r in status.list_clusters(store)}
    assert rows["kept"].nodes == 2
    assert rows["gone"].state.endswith("(missing at fake)")
    assert rows["stray"].state == "untracked (tags only)" and rows["stray"].provider == "fake"


def test_down_removes_the_clusters_ssh_connection_directory_and_no_other(
    fake: FakeProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuprov import templating
    from gpuprov.cluster import files_for
    from gpuprov.probes.run import control_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    Store().create_cluster("gone", "fake", {})
    files = files_for("gone")
    files.dir.mkdir(parents=True, exist_ok=True)
    files.ansible_cfg.write_text(templating.render("ansible.cfg.j2", {
        "cluster": "gone", "forks": 5, "inventory": "i", "roles_path": "r", "strategy_plugins": None}))
    sockets = control_dir(files.ansible_cfg)
    assert sockets == tmp_path / "home" / ".ansible" / "cp" / "gone"
    (sockets / "0123abcd").touch()
    other = sockets.parent / "kept"
    other.mkdir()
    down.down("gone", console=Console(quiet=True))
    assert not sockets.exists() and not files.dir.exists()
    assert other.is_dir()
