"""`gpuprov slurm account add|list` and `down --keep-accounting` through the command line, on
on-prem (static) clusters' records: the refusals (a bad name, a cluster without Slurm or
recorded with --no-accounting) come before anything is asked of a controller, so the FIXTURE
here is only the controller's answer (gpuprov.slurm.scheduler.on_controller answers like
`sacctmgr` and records the words it was given) and, for the export, the SSH hop itself
(scheduler.controller_command gives a local `sh` in its place, whose output is streamed into
the export as ssh's would be). Real sacctmgr and mysqldump over real SSH:
tests/e2e/test_slurm_e2e.py."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from gpuprov.slurm import accounts
from gpuprov.state import NodeRecord, Store
from tests.conftest import invoke

# What `sacctmgr -n -P list associations format=account,user` prints on a cluster with one account.
ASSOCIATIONS = "root|\nroot|root\nresearch|\nresearch|alice\n"


@pytest.fixture
def asked(gpuprov_home: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Clusters `rack` (Slurm with accounting), `plain` (no Slurm) and `noacct` (Slurm,
    --no-accounting), static; the words each controller was asked to run."""
    store = Store()
    for name, options in (("rack", {"scheduler": "slurm"}), ("plain", {}),
                          ("noacct", {"scheduler": "slurm", "slurm_accounting": False})):
        store.create_cluster(name, "static", {"options": options})
        # Port 9 on this machine: nothing answers there, so the provider's look at the hosts is quick.
        store.replace_nodes(name, [NodeRecord(name=f"{name}-1", id=f"{name}-1", address="127.0.0.1", ssh_port=9,
                                              user="gpuprov", state="reachable")])
    seen: list[tuple[str, ...]] = []

    def answer(cluster, files, nodes, argv):  # FIXTURE: the controller's answer
        seen.append(tuple(argv))
        return f"{cluster.name}-1", ASSOCIATIONS if "list" in argv else "", ""

    monkeypatch.setattr("gpuprov.slurm.scheduler.on_controller", answer)
    return seen


def test_the_recorded_options_are_what_the_fixture_means(asked) -> None:
    from gpuprov.slurm import scheduler

    chosen = {c.name: scheduler.of(c) for c in Store().list_clusters()}
    assert (chosen["rack"].kind, chosen["rack"].accounting) == ("slurm", True)
    assert chosen["plain"].kind != "slurm"
    assert (chosen["noacct"].kind, chosen["noacct"].accounting) == ("slurm", False)


@pytest.mark.parametrize(("args", "needle"), [
    (("rack", "Research", "--user", "alice"), "account 'Research': not a Slurm account name"),
    (("rack", "r;id", "--user", "alice"), "account 'r;id': not a Slurm account name"),
    (("rack", "9lab", "--user", "alice"), "account '9lab'"),
    (("rack", "a" * 33, "--user", "alice"), "at most 32"),
    (("rack", "research", "--user", "alice", "--user", "$(id)"), "--user '$(id)': not a Slurm user name"),
    (("rack", "research", "--user", "-x"), "--user '-x'"),
    (("rack", "research", "--user", "al ice"), "--user 'al ice'"),
    (("rack", "research"), "at least one --user USER"),
])
def test_a_bad_name_is_one_line_exit_2_and_nothing_is_run(capsys, asked, args, needle) -> None:
    code, out, err = invoke(capsys, "slurm", "account", "add", *args)
    assert (code, out) == (2, "")
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert asked == []


@pytest.mark.parametrize(("name", "needle"), [("plain", "runs no Slurm"), ("noacct", "recorded with --no-accounting")])
@pytest.mark.parametrize("args", [("slurm", "account", "add", "{}", "research", "--user", "alice"),
                                  ("slurm", "account", "list", "{}"), ("down", "{}", "--keep-accounting", "--yes")])
def test_a_cluster_without_accounting_is_refused_before_anything_runs(capsys, asked, name, needle, args) -> None:
    code, out, err = invoke(capsys, *[a.format(name) for a in args])
    assert out == "" and code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert asked == [] and Store().get_cluster(name) is not None


def test_keep_accounting_on_an_unknown_cluster_is_one_line_exit_2(capsys, asked) -> None:
    code, _, err = invoke(capsys, "down", "gone", "--keep-accounting", "--yes")
    assert code == 2 and "no cluster 'gone' is recorded here" in err and len(err.strip().splitlines()) == 1


def test_add_makes_only_what_is_missing_with_fixed_words(capsys, asked) -> None:
    code, out, err = invoke(capsys, "slurm", "account", "add", "rack", "vision", "--user", "bob", "--user", "carol")
    assert (code, out) == (0, ""), err
    assert asked == [accounts.LIST_ASSOCIATIONS,
                     ("sudo", "-n", "sacctmgr", "-i", "add", "account", "vision"),
                     ("sudo", "-n", "sacctmgr", "-i", "add", "user", "bob", "Account=vision"),
                     ("sudo", "-n", "sacctmgr", "-i", "add", "user", "carol", "Account=vision")]
    assert "account vision added" in err and "user carol added to account vision" in err


def test_adding_what_is_there_says_so_and_changes_nothing(capsys, asked) -> None:
    code, out, err = invoke(capsys, "slurm", "account", "add", "rack", "research", "--user", "alice")
    assert (code, out) == (0, ""), err
    assert asked == [accounts.LIST_ASSOCIATIONS]
    assert err.splitlines() == ["rack: account research is there already",
                                "rack: user alice is in account research already", "rack: nothing changed"]
    asked.clear()
    code, _, _ = invoke(capsys, "slurm", "account", "add", "rack", "research", "--user", "alice", "--user", "dave")
    assert code == 0 and asked == [accounts.LIST_ASSOCIATIONS, accounts.add_user("dave", "research")]


def test_list_reads_the_associations_as_accounts_with_their_users(capsys, asked) -> None:
    code, out, err = invoke(capsys, "slurm", "account", "list", "rack", "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {"cluster": "rack", "controller": "rack-1", "accounts": [
        {"account": "research", "users": ["alice"]}, {"account": "root", "users": ["root"]}]}
    assert asked == [("sacctmgr", "-n", "-P", "list", "associations", "format=account,user")]


def test_a_line_that_is_no_account_and_user_is_left_out() -> None:
    text = "research|alice\nbad line\nx|Y;rm\n\x1b[31mred|alice\nlab|\n"
    assert accounts.parse_associations(text) == {"lab": [], "research": ["alice"]}


def test_a_failed_export_removes_nothing_and_says_how_to_go_on(capsys, asked, monkeypatch, gpuprov_home) -> None:
    # FIXTURE: the SSH hop; the command "on the controller" fails as mysqldump would.
    def command(cluster, files, nodes, argv):
        return "rack-1", ["sh", "-c", "echo 'mysqldump: Got error: 1045' >&2; exit 2"
                          if "mysqldump" in argv else "echo 'JobID|User'; echo '1|alice'"]

    monkeypatch.setattr("gpuprov.slurm.scheduler.controller_command", command)
    code, _, err = invoke(capsys, "down", "rack", "--keep-accounting", "--yes")
    (line,) = [x for x in err.splitlines() if x.startswith("gpuprov:")]
    assert code == 1 and line == err.strip().splitlines()[-1], err
    assert "mysqldump on rack-1: mysqldump: Got error: 1045" in line and "nothing was removed" in line
    assert "without --keep-accounting" in line and "exporting a mysqldump of slurm_acct_db from rack-1" in err and "nothing was removed" in err and "without --keep-accounting" in err
    assert Store().get_cluster("rack") is not None
    assert list((gpuprov_home / "clusters" / "rack").glob("accounting-*")) == []


def test_the_export_is_kept_after_down_and_private(capsys, asked, monkeypatch, gpuprov_home) -> None:
    def command(cluster, files, nodes, argv):  # FIXTURE: the SSH hop
        return "rack-1", ["sh", "-c", "printf 'CREATE TABLE t;\\n'" if "mysqldump" in argv else "printf '1|alice\\n'"]

    monkeypatch.setattr("gpuprov.slurm.scheduler.controller_command", command)
    code, _, err = invoke(capsys, "down", "rack", "--keep-accounting", "--yes")
    assert code == 0, err
    (kept,) = (gpuprov_home / "clusters" / "rack").iterdir()
    assert kept.name.startswith("accounting-") and f"its accounting is kept in {kept}" in err
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert {p.name: (p.read_text(), stat.S_IMODE(p.stat().st_mode)) for p in kept.iterdir()} == {
        "sacct.txt": ("1|alice\n", 0o600), "slurm_acct_db.sql": ("CREATE TABLE t;\n", 0o600)}
    assert Store().get_cluster("rack") is None


def test_down_says_the_database_goes_with_the_controller(capsys, asked) -> None:
    code, _, err = invoke(capsys, "down", "rack", "--yes")
    assert code == 0, err
    assert "rack: its Slurm accounting database (every job's record) goes with its node rack-1" in err
    assert "`gpuprov down rack --keep-accounting` exports it first" in err
    code, _, err = invoke(capsys, "down", "noacct", "--yes")
    assert code == 0 and "accounting" not in err
