"""`gpuprov usage` through the command line, on an on-prem (static) Slurm cluster's record whose
controller answers from a real recording (tests/fixtures/recordings/sacct-two-nodes/): the
FIXTURE is the SSH hop alone (gpuprov.slurm.scheduler.on_controller answered from the recorded
sinfo and sacct, and each node's Slurm name read as its own), so that the command's own path
(the record, the window, the rules, the prices or why there are none, the table and the JSON) is
what runs. The arithmetic is tests/unit/test_slurm_usage.py's; accounting on a real cluster,
read by `gpuprov usage`, is tests/e2e/test_slurm_e2e.py's (docs/slurm.md, "Accounting")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.pricing.cost import why_no_price
from gpuprov.state import NodeRecord, Store
from tests.conftest import invoke
from tests.fixtures.recorded_node import body

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "sacct-two-nodes"
WINDOW = ("--since", "2026-12-06T23:41:00", "--until", "2026-12-06T23:43:10Z")


def _recorded(name: str) -> str:
    return "\n".join(body((FOLDER / name).read_text())) + "\n"


@pytest.fixture
def rack(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The cluster `rack` (static, Slurm on acctnode): the commands its controller was asked."""
    store = Store()
    store.create_cluster("rack", "static", {"options": {"scheduler": "slurm", "slurm_controller": "acctnode"}})
    # Port 9 on this machine: nothing answers there, so the provider's look at the hosts is quick.
    store.replace_nodes("rack", [NodeRecord(name=n, id=n, address="127.0.0.1", ssh_port=9, user="gpuprov",
                                            state="reachable") for n in ("acctnode", "acctnode2")])
    asked: list[tuple[str, ...]] = []

    def answer(cluster, files, nodes, argv):  # FIXTURE: the controller's answers, recorded
        asked.append(tuple(argv))
        if argv[0] == "sinfo":
            return "acctnode", _recorded("sinfo.txt"), ""
        return "acctnode", _recorded("sacct.txt"), ""

    monkeypatch.setattr("gpuprov.slurm.scheduler.on_controller", answer)
    monkeypatch.setattr("gpuprov.core.usage.slurm_names", lambda nodes, files: {n.name: n.name for n in nodes})
    return asked


def test_usage_per_user_with_hours_and_why_there_is_no_price(capsys, rack) -> None:
    code, out, err = invoke(capsys, "usage", "rack", *WINDOW, "-o", "json")
    assert code == 0, err
    data = json.loads(out)
    rows = {r["key"]: r for r in data["rows"]}
    assert {u: r["gpu_hours"] for u, r in rows.items()} == \
        {"alice": round(30 / 3600, 4), "bob": round(8 / 3600, 4), "carol": round(14 / 3600, 4)}
    no_price = why_no_price("static")  # "existing hosts: gpuprov knows no price for machines it did not launch"
    assert no_price and all((r["usd"], r["why"]) == (None, no_price) for r in rows.values())
    assert data["idle"]["gpu_hours"] == round(468 / 3600, 4) and data["idle"]["usd"] is None
    assert (data["since"], data["until"], data["controller"]) == \
        ("2026-12-06T23:41:00Z", "2026-12-06T23:43:10Z", "acctnode")
    sacct = next(a for a in rack if a[0] == "sacct")
    assert "--starttime=2026-12-06T23:41:00" in sacct and "--endtime=2026-12-06T23:43:10" in sacct


def test_the_table_has_the_idle_row_and_each_nodes_price_line(capsys, rack) -> None:
    code, out, _ = invoke(capsys, "usage", "rack", *WINDOW, "--by", "account")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "rack: usage from 2026-12-06T23:41:00Z to 2026-12-06T23:43:10Z (sacct on acctnode)"
    assert any(line.split()[:2] == ["│", "research"] for line in lines), out
    assert any("(idle)" in line for line in lines)
    assert any(line.startswith("acctnode: no price: ") for line in lines), out


@pytest.mark.parametrize(("args", "needle"), [
    (("--since", "2026-12-07", "--until", "2026-12-06"), "is not before --until"),
    (("--since", "last week"), "--since 'last week': expected a date"),
    (("--by", "partition"), "Invalid value for '--by'"),
])
def test_bad_input_is_one_line_exit_2_and_asks_nothing(capsys, rack, args, needle) -> None:
    code, out, err = invoke(capsys, "usage", "rack", *args)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1 and needle in err, err
    assert rack == []


def test_a_cluster_without_slurm_is_refused(capsys, gpuprov_home: Path) -> None:
    Store().create_cluster("plain", "static", {})
    code, _, err = invoke(capsys, "usage", "plain")
    assert code == 2 and "plain: runs no Slurm" in err and len(err.strip().splitlines()) == 1


def test_accounting_that_is_off_is_one_line_exit_1(capsys, rack, monkeypatch) -> None:
    said = (FOLDER / "sacct-accounting-none.txt").read_text().splitlines()[1]  # sacct's own words
    monkeypatch.setattr("gpuprov.slurm.scheduler.on_controller",  # FIXTURE: as recorded
                        lambda c, f, n, argv: ("acctnode", _recorded("sinfo.txt"), "") if argv[0] == "sinfo"
                        else ("acctnode", None, f"sacct on acctnode: {said}"))
    code, out, err = invoke(capsys, "usage", "rack", *WINDOW)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "Slurm accounting storage is disabled" in err and "Accounting and usage" in err


def test_a_cluster_recorded_without_accounting_is_one_line_exit_2_and_asks_nothing(capsys, rack) -> None:
    store = Store()
    store.set_spec("rack", {**store.get_cluster("rack").spec,
                            "options": {"scheduler": "slurm", "slurm_controller": "acctnode", "slurm_accounting": False}})
    code, out, err = invoke(capsys, "usage", "rack", *WINDOW)
    assert (code, out) == (2, "") and len(err.strip().splitlines()) == 1, err
    assert "rack: recorded with --no-accounting" in err and "--accounting" in err
    assert rack == []
