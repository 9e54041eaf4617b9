"""`--no-accounting` on `up` and `--accounting/--no-accounting` on `provision` (issue 59), read by
the real command line: what reaches the commands' cores, the refusals (one line, exit 2, nothing
made), and the calls of the e2e units whose clusters run Slurm without accounting
(tests/e2e/test_elastic_e2e.py, test_static_onprem.py) or with it on a node of their choosing
(test_patch_e2e.py: --slurm-dbd), parsed as they are written there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuprov.errors import BadInput
from tests.conftest import invoke


class _Seen(BadInput):
    """Raised by the stand-in cores: the command line was read, and what it asked is kept."""


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from gpuprov.core import provision, up

    found: dict[str, Any] = {}

    def fake_up(request: Any, **_: Any) -> None:
        found["up"] = request.spec.scheduler
        raise _Seen("seen")

    def fake_provision(name: str, **kw: Any) -> None:
        found["provision"] = kw
        raise _Seen("seen")

    monkeypatch.setattr(up, "up", fake_up)
    monkeypatch.setattr(provision, "provision", fake_provision)
    return found


# The e2e units' calls, as written there (the cluster's name and hosts file stand in).
ELASTIC_UP = ["up", "--provider", "docker", "--count", "1", "--name", "ela-x", "--scheduler", "slurm",
              "--max-count", "3", "--idle-minutes", "1", "--no-accounting", "--tags", "rdma,slurm",
              "--health", "off", "--no-verify", "-o", "json"]
PATCH_PROVISION = ["provision", "fleet-x", "--scheduler", "slurm", "--slurm-dbd", "fleet-x-node-3", "--tags", "slurm"]
STATIC_UP = ["up", "--provider", "static", "--hosts", "HOSTS", "--name", "sl-x", "--source", "distro",
             "--scheduler", "slurm", "--slurm-controller", "rack-2", "--no-accounting", "--no-bootstrap", "-o",
             "json"]


@pytest.mark.parametrize("args", [ELASTIC_UP, STATIC_UP])
def test_up_with_no_accounting_asks_a_slurm_cluster_without_it(capsys, gpuprov_home: Path, seen, tmp_path: Path,
                                                                args: list[str]) -> None:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("")
    code, _, err = invoke(capsys, *[str(hosts) if a == "HOSTS" else a for a in args])
    assert (code, err.strip()) == (2, "gpuprov: seen")
    assert seen["up"].kind == "slurm" and seen["up"].accounting is False


def test_up_asks_accounting_by_default(capsys, gpuprov_home: Path, seen) -> None:
    code, _, _ = invoke(capsys, *[a for a in ELASTIC_UP if a != "--no-accounting"])
    assert code == 2 and seen["up"].accounting is True


@pytest.mark.parametrize(("flags", "want"), [([], None), (["--no-accounting"], False), (["--accounting"], True)])
def test_provision_passes_accounting_only_where_given(capsys, gpuprov_home: Path, seen, flags, want) -> None:
    code, _, _ = invoke(capsys, "provision", "fleet-x", *flags)
    assert code == 2 and seen["provision"]["accounting"] is want


def test_the_patch_units_provision_parses(capsys, gpuprov_home: Path, seen) -> None:
    code, _, _ = invoke(capsys, *PATCH_PROVISION)
    assert code == 2 and seen["provision"]["accounting"] is None  # on, as a Slurm cluster's default
    assert seen["provision"]["scheduler_choice"].kind == "slurm"
    assert seen["provision"]["scheduler_choice"].dbd == "fleet-x-node-3"


@pytest.mark.parametrize(("args", "words"), [
    (["up", "--provider", "docker", "--count", "1", "--no-accounting", "--dry-run"],
     "gpuprov: --no-accounting goes with --scheduler slurm (accounting is Slurm's)"),
    (["provision", "nosuch", "--via", "pull", "--no-accounting"],
     "gpuprov: --via pull cannot go with --accounting/--no-accounting: pull never configures Slurm"),
])
def test_accounting_flags_that_cannot_be_are_one_line(capsys, gpuprov_home: Path, args, words) -> None:
    code, out, err = invoke(capsys, *args)
    assert (code, out, err.strip()) == (2, "", words)
    assert not (gpuprov_home / "clusters").exists()
