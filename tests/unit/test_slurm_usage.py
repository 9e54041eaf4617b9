"""`gpuprov usage`'s arithmetic (gpuprov/slurm/usage.py) on a real `sacct` of a two-node Slurm
cluster with accounting (tests/fixtures/recordings/sacct-two-nodes/: three users, two accounts,
a job across both nodes, a failed one, one running and one pending when captured). The nodes'
prices are this test's: acctnode on-demand at 4.00 USD an hour, acctnode2 spot at 1.20. Every
expected figure below was worked out by hand from the recording (seconds noted beside it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuprov.errors import GpuprovError
from gpuprov.slurm.elastic import hostnames
from gpuprov.slurm.usage import NodeFacts, parse_sacct, parse_sinfo_gres, sacct_argv, tres, usage
from tests.fixtures.recorded_node import body

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "sacct-two-nodes"
SINCE = datetime(2026, 12, 6, 23, 41, 0, tzinfo=UTC)
UNTIL = datetime(2026, 12, 6, 23, 43, 10, tzinfo=UTC)  # when it was captured: job 9 runs 8 s by then


def _read(name: str) -> str:
    return "\n".join(body((FOLDER / name).read_text()))


def _nodes(acctnode2_price: float | None = 1.2) -> dict[str, NodeFacts]:
    shape = parse_sinfo_gres(_read("sinfo.txt"))
    assert shape == {"acctnode": (2, 2), "acctnode2": (2, 2)}
    return {
        "acctnode": NodeFacts(*shape["acctnode"], usd_per_hour=4.0, source="on-demand, test price"),
        "acctnode2": NodeFacts(*shape["acctnode2"], usd_per_hour=acctnode2_price, source="spot, test price",
                               why=None if acctnode2_price is not None else "acctnode2: no price known"),
    }


def test_the_recorded_jobs_are_read_whole() -> None:
    jobs = {j.job_id: j for j in parse_sacct(_read("sacct.txt"))}
    assert sorted(jobs, key=int) == [str(i) for i in range(1, 11)]
    assert (jobs["6"].user, jobs["6"].nodes, jobs["6"].gpus, jobs["6"].cpus) == \
        ("alice", ("acctnode", "acctnode2"), 4, 2)
    assert (jobs["3"].gpus, jobs["5"].state, jobs["9"].end, jobs["10"].start, jobs["10"].nodes) == \
        (0, "FAILED", None, None, ())
    assert (FOLDER / "sacct.txt").read_text().splitlines()[0] == \
        "$ " + " ".join(sacct_argv(datetime(2026, 12, 6, tzinfo=UTC), datetime(2026, 12, 6, tzinfo=UTC))) \
        .replace("--endtime=2026-12-06T00:00:00", "--endtime=now")


def test_gpu_hours_and_cost_per_user() -> None:
    got = usage(parse_sacct(_read("sacct.txt")), _nodes(), SINCE, UNTIL)
    rows = {r["key"]: r for r in got["rows"]}
    # alice: 1 GPU 4 s + 2 GPUs 3 s on acctnode, 2 GPUs on each node 5 s (job 6): 30 GPU-s.
    # Paid: 0.5 x 4.00 x 4 s + 1.0 x 4.00 x 3 s + 1.0 x 4.00 x 5 s + 1.0 x 1.20 x 5 s.
    assert rows["alice"] == {"key": "alice", "users": ["alice"], "jobs": 3, "gpu_hours": round(30 / 3600, 4),
                             "node_hours": round((4 + 3 + 2 * 5) / 3600, 4),
                             "usd": round((8 + 12 + 20 + 6) / 3600, 4), "why": None, "accounts": ["research"]}
    # bob: 3 + 1 s on acctnode, 4 s on acctnode2, one GPU each; his pending job 10 used nothing.
    assert (rows["bob"]["jobs"], rows["bob"]["gpu_hours"], rows["bob"]["usd"]) == \
        (3, round(8 / 3600, 4), round((0.5 * 4 * 4 + 0.5 * 1.2 * 4) / 3600, 4))
    # carol: job 3 no GPU (one of 2 CPUs for 2 s), job 8 one GPU 6 s, job 9 one GPU 8 s so far.
    assert (rows["carol"]["gpu_hours"], rows["carol"]["usd"]) == \
        (round(14 / 3600, 4), round((0.5 * 4 * 2 + 0.5 * 4 * 6 + 0.5 * 1.2 * 8) / 3600, 4))
    assert [r["key"] for r in got["rows"]] == ["alice", "carol", "bob"]  # most GPU-hours first
    # Idle: 130 s x 2 GPUs on each node, less what jobs held (30 GPU-s on acctnode, 22 on acctnode2).
    assert got["idle"]["gpu_hours"] == round((260 - 30 + 260 - 22) / 3600, 4)
    paid_1 = (0.5 * 4 * (4 + 3 + 1 + 2 + 6) + 4 * (3 + 5)) / 3600
    paid_2 = (1.2 * 5 + 0.5 * 1.2 * (4 + 8)) / 3600
    assert got["idle"]["usd"] == round(4 * 130 / 3600 - paid_1 + 1.2 * 130 / 3600 - paid_2, 4)
    # Every dollar of both nodes' 130 s is someone's or idle.
    assert got["total"]["usd"] == pytest.approx((4 + 1.2) * 130 / 3600, abs=2e-4)
    assert got["total"]["gpu_hours"] == pytest.approx(4 * 130 / 3600, abs=2e-4)


def test_by_account_and_by_job() -> None:
    jobs = parse_sacct(_read("sacct.txt"))
    accounts = {r["key"]: r for r in usage(jobs, _nodes(), SINCE, UNTIL, by="account")["rows"]}
    assert accounts["research"]["users"] == ["alice", "bob"] and accounts["inference"]["users"] == ["carol"]
    assert accounts["research"]["gpu_hours"] == round(38 / 3600, 4)
    per_job = {r["key"]: r for r in usage(jobs, _nodes(), SINCE, UNTIL, by="job")["rows"]}
    assert "10" not in per_job  # pending: no hours
    assert per_job["6"]["node_hours"] == round(10 / 3600, 4) and per_job["6"]["users"] == ["alice"]


def test_a_window_cuts_the_jobs_it_does_not_hold() -> None:
    jobs = parse_sacct(_read("sacct.txt"))
    later = datetime(2026, 12, 6, 23, 42, 43, tzinfo=UTC)  # after job 6, 2 s into jobs 7 and 8
    rows = {r["key"]: r for r in usage(jobs, _nodes(), later, UNTIL, by="job")["rows"]}
    assert sorted(rows) == ["7", "8", "9"]
    assert (rows["7"]["gpu_hours"], rows["8"]["gpu_hours"]) == (round(2 / 3600, 4), round(4 / 3600, 4))


def test_a_node_without_a_price_leaves_its_costs_unknown_with_why() -> None:
    got = usage(parse_sacct(_read("sacct.txt")), _nodes(acctnode2_price=None), SINCE, UNTIL)
    rows = {r["key"]: r for r in got["rows"]}
    assert rows["alice"]["usd"] is None and rows["alice"]["why"] == "acctnode2: no price known"
    assert rows["alice"]["gpu_hours"] == round(30 / 3600, 4)  # hours still counted
    assert got["idle"]["usd"] is None and got["total"]["usd"] is None
    assert got["prices"]["acctnode2"] == {"usd_per_hour": None, "source": "spot, test price",
                                          "why": "acctnode2: no price known"}


def test_a_node_gone_from_the_cluster_is_named() -> None:
    nodes = _nodes()
    del nodes["acctnode2"]
    rows = {r["key"]: r for r in usage(parse_sacct(_read("sacct.txt")), nodes, SINCE, UNTIL)["rows"]}
    assert rows["bob"]["usd"] is None
    assert rows["bob"]["why"] == "acctnode2: not a node of this cluster now (its price is unknown)"


@pytest.mark.parametrize("line", ["1|alice|research", "1|alice|r|gpu|n|1|cpu=1|bad-time|Unknown|1|COMPLETED",
                                  "1|a|r|gpu|n-[1|1|cpu=1|Unknown|Unknown|0|PENDING"])
def test_a_line_of_another_shape_is_an_error_not_a_guess(line: str) -> None:
    with pytest.raises(GpuprovError):
        parse_sacct(line)


def test_usage_by_something_else_is_refused() -> None:
    with pytest.raises(GpuprovError, match="one of user, account, job"):
        usage([], _nodes(), SINCE, UNTIL, by="partition")


def test_hostlists_and_gres_lists() -> None:
    assert hostnames("gpu-[01-03,7],login") == ["gpu-01", "gpu-02", "gpu-03", "gpu-7", "login"]
    assert hostnames("None assigned") == []
    assert tres("billing=2,cpu=2,gres/gpu=4,mem=2G,node=2") == {"billing": 2, "cpu": 2, "gres/gpu": 4, "node": 2}
    assert parse_sinfo_gres("a|96|gpu:h100:8(S:0-1)\nb|8|gpu:1g.10gb:7(S:0),shard:4\nc|4|(null)\n") == \
        {"a": (96, 8), "b": (8, 7), "c": (4, 0)}


@pytest.mark.parametrize("name", ["sacct-no-slurmdbd.txt", "sacct-accounting-none.txt"])
def test_the_recorded_refusals_exit_non_zero(name: str) -> None:
    """What gpuprov shows when accounting is off or slurmdbd is away: sacct's own words, exit 1."""
    text = (FOLDER / name).read_text().splitlines()
    assert text[-1] == "[exit 1]" and text[1]
