"""Which probes prove which play (gpuprov/probes/run.py PLAY_GROUPS): every play of site.yml has
its groups, every probe group belongs to a play, and a run of some plays (`--tags`) is judged on
theirs alone (the pull agent runs those on itself: gpuprov/pull/node/agent.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuprov.probes import run

ROOT = Path(__file__).resolve().parents[2]


def _site_tags() -> list[str]:
    tags = []
    for entry in yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text()):
        (play,) = yaml.safe_load((ROOT / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text())
        tags += play["tags"]
    return tags


def test_every_play_of_the_site_has_its_probe_groups_and_every_group_a_play() -> None:
    assert sorted(run.PLAY_GROUPS) == sorted(_site_tags())
    known = set(run.probe_groups())
    named = {g for groups in run.PLAY_GROUPS.values() for g in groups}
    assert named <= known, named - known
    # base: every play's gpuprov_base; full: a level, not a group of a play
    assert named | {"base", "full"} == known


@pytest.mark.parametrize(("tags", "expr"), [
    (["preflight", "driver", "cuda"], "base or preflight or driver or dkms or fabricmanager or gpu or cuda or cudnn"),
    (["preflight", "spot", "rdma", "microcode"], "base or preflight or rdma or microcode"),
    (["spot"], "base"),
    ([], None),  # the whole site: every probe
    (["preflight", "monitoring"], None),  # a tag that is no play of the site's: every probe
])
def test_a_run_of_some_plays_is_judged_on_their_probes(tags: list[str], expr: str | None) -> None:
    assert run.groups_of_plays(tags) == expr
    if expr:
        assert run.check_groups(expr) == expr


@pytest.mark.parametrize("tags", [[tag] for tag in run.PLAY_GROUPS] + [[]])
def test_the_controller_expects_exactly_the_probes_the_agent_selects(tags: list[str]) -> None:
    """What the pull controller holds a node's report to (read off the probes' source) is what the
    agent's pytest selects with the same marker expression."""
    import subprocess
    import sys

    from gpuprov import paths
    from gpuprov.pull.controller import expected_probes

    groups = run.groups_of_plays(tags)
    expr = f"({groups}) and not full" if groups else "not full"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", expr, str(paths.probes_dir())], capture_output=True, text=True, check=False,
                         cwd=paths.probes_dir()).stdout
    selected = {line.split("::")[-1].split("[")[0].removeprefix("test_") for line in out.splitlines() if "::" in line}
    assert selected and expected_probes(groups=groups) == selected
