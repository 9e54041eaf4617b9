"""Dynamic nodes from the commands' side (gpuprov.core.elastic and gpuprov.slurm.scheduler):
what `--max-count`/`--idle-minutes` make of a cluster's recorded choice, the checks against its
provider, the slurm play's variables, the power service's address file and log, and the Reason a
failed resume writes into Slurm (one line of plain characters whatever the error said)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuprov.core import elastic
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.providers import get as get_provider
from gpuprov.slurm import scheduler
from gpuprov.slurm.scheduler_choice import Replacement, Scheduler
from gpuprov.state import ClusterRecord, NodeRecord


def _cluster(options: dict, names=("c-node-1", "c-node-2")) -> ClusterRecord:
    nodes = tuple(NodeRecord(name=n, id=n, address="127.0.0.1", ssh_port=2200 + i, user="gpuprov", state="running",
                             instance_type="docker-node") for i, n in enumerate(names))
    return ClusterRecord(name="c", provider="docker", spec={"options": options}, nodes=nodes, lock={"hash": "abc"},
                         state="verified", created="2026", failed_step=None)


def test_the_choice_round_trips_through_the_record() -> None:
    chosen = Scheduler(kind="slurm", controller="c-node-2", max_count=5, idle_minutes=3)
    assert Scheduler.from_options(chosen.as_options()) == chosen
    assert Scheduler(kind="slurm").as_options() == {"scheduler": "slurm"}


@pytest.mark.parametrize(("given", "max_count", "idle", "want"), [
    (None, None, None, None),  # nothing asked: nothing changes
    (None, 6, None, Scheduler(kind="slurm", max_count=6, idle_minutes=2)),
    (None, None, 5, Scheduler(kind="slurm", max_count=4, idle_minutes=5)),
    # --scheduler slurm again keeps the dynamic nodes recorded
    (Scheduler(kind="slurm", controller="c-node-2"), None, None,
     Scheduler(kind="slurm", controller="c-node-2", max_count=4, idle_minutes=2)),
    (Scheduler(kind="none"), None, None, Scheduler(kind="none")),
])
def test_provision_keeps_what_it_is_not_given(given, max_count, idle, want) -> None:
    recorded = Scheduler(kind="slurm", max_count=4, idle_minutes=2)
    assert elastic.merged(recorded, given, max_count, idle) == want


@pytest.mark.parametrize(("chosen", "count", "provider", "words"), [
    (Scheduler(kind="slurm", max_count=1), 2, "docker", "--max-count 1 is smaller than --count 2"),
    (Scheduler(kind="slurm", max_count=3, idle_minutes=0), 1, "docker", "--idle-minutes 0"),
    (Scheduler(kind="slurm", max_count=3), 1, "static", "--max-count with --provider static"),
])
def test_dynamic_nodes_that_cannot_be_are_one_line(chosen, count, provider, words) -> None:
    with pytest.raises(BadInput, match=words) as info:
        elastic.check(chosen, count, get_provider(provider))
    assert "\n" not in str(info.value)


def test_without_slurm_there_are_no_dynamic_nodes_to_ask_for() -> None:
    with pytest.raises(BadInput, match="dynamic nodes are Slurm's"):
        Scheduler(kind="none", max_count=3).checked()
    with pytest.raises(BadInput, match="--idle-minutes goes with --max-count"):
        Scheduler(kind="slurm", idle_minutes=3).checked()
    assert elastic.check(Scheduler(kind="slurm"), 2, get_provider("docker")) is None


def test_the_play_gets_the_dynamic_nodes_like_a_compute_node_and_the_service(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path)
    cluster = _cluster(Scheduler(kind="slurm", max_count=4, idle_minutes=2).as_options())
    # No service has said where it listens yet: no dynamic nodes in this run's play.
    assert scheduler.dynamic_vars(cluster, files, scheduler.of(cluster)) == {}
    (tmp_path / scheduler.POWER_SERVICE).write_text(json.dumps({"url": "http://172.17.0.1:41234/power", "pid": 1}))
    got = scheduler.dynamic_vars(cluster, files, scheduler.of(cluster))
    assert got["gpuprov_slurm_dynamic_nodes"] == [{"name": "c-dy-1", "like": "c-node-2"},
                                                  {"name": "c-dy-2", "like": "c-node-2"}]
    assert got["gpuprov_slurm_power"] == {"suspend_time": 120, "suspend_timeout": scheduler.SUSPEND_TIMEOUT_S,
                                          "resume_timeout": scheduler.RESUME_TIMEOUT_S}
    assert got["gpuprov_slurm_power_service"] == {"url": "http://172.17.0.1:41234/power",
                                                  "key_src": str(tmp_path / scheduler.POWER_KEY)}
    assert (tmp_path / scheduler.POWER_KEY).stat().st_mode & 0o777 == 0o600


def test_a_one_node_cluster_makes_them_like_its_controller_unless_it_runs_no_jobs() -> None:
    alone = _cluster(Scheduler(kind="slurm", max_count=3).as_options(), names=("c-node-1",))
    assert scheduler.template_node(alone) == "c-node-1"
    only = _cluster(Scheduler(kind="slurm", max_count=3, controller_only=True).as_options(), names=("c-node-1",))
    with pytest.raises(BadInput, match="no compute node to make dynamic nodes like"):
        scheduler.template_node(only)


def test_the_service_state_is_its_process_not_a_stale_file(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path)
    assert elastic.service_state(files, "c") == {}
    (tmp_path / scheduler.POWER_SERVICE).write_text(json.dumps({"url": "http://x:1/power", "pid": os.getpid()}))
    # This process is no power service of cluster c: a pid reused is not taken for it.
    assert elastic.service_state(files, "c") == {"url": "http://x:1/power", "pid": os.getpid(), "running": False}
    assert elastic.stop_service(files, "c") is False


def test_the_log_tail_is_its_last_lines_made_printable(tmp_path: Path) -> None:
    log = tmp_path / elastic.LOG
    log.write_bytes(b"".join(f"line {i}\n".encode() for i in range(50_000)) + b"bad \x1b[2J end\n")
    tail = elastic.log_tail(ClusterFiles(tmp_path), 3)
    assert tail == ["line 49998", "line 49999", "bad ?[2J end"]


@pytest.mark.parametrize(("text", "want"), [
    ("resume failed: image x:y is gone", "resume failed: image x:y is gone"),
    ("line one\nline two\r\n\tthree", "line one line two three"),
    ('quote" and $(rm -rf /) `x` ;|&<>', "quote? and ?(rm -rf /) ?x? ;????"),
    ("x" * 500, "x" * scheduler.MAX_REASON),
])
def test_a_reason_is_one_line_of_plain_characters(text: str, want: str) -> None:
    assert scheduler.reason_text(text) == want


# sinfo's %T words for dynamic nodes, as slurmctld 22.05.8 showed them in the recorded run
# (tests/fixtures/recordings/slurm-22.05-debian12/elastic-local.txt) and the e2e test.
@pytest.mark.parametrize(("running", "states", "suspects", "want"), [
    # powered down in Slurm and running here, at two checks in a row: an orphan
    (["c-dy-1"], {"c-dy-1": "idle~"}, {"c-dy-1"}, (["c-dy-1"], {"c-dy-1"})),
    # ... at the first check only: a suspect, not removed yet
    (["c-dy-1"], {"c-dy-1": "idle~"}, set(), ([], {"c-dy-1"})),
    # powering up (the resume that made it), powering down (its suspend), up and busy: none
    (["c-dy-1", "c-dy-2", "c-dy-3"], {"c-dy-1": "mixed#", "c-dy-2": "idle%", "c-dy-3": "mixed"},
     {"c-dy-1", "c-dy-2", "c-dy-3"}, ([], set())),
    # a node Slurm does not list at all (slurm.conf lost it): an orphan too
    (["c-dy-9"], {"c-dy-1": "idle~"}, {"c-dy-9"}, (["c-dy-9"], {"c-dy-9"})),
    # DOWN and powered down (a resume that failed, its container left): an orphan
    (["c-dy-2"], {"c-dy-2": "down~"}, {"c-dy-2"}, (["c-dy-2"], {"c-dy-2"})),
])
def test_an_orphan_is_a_running_node_slurm_has_powered_down_twice_in_a_row(running, states, suspects, want) -> None:
    from gpuprov.core.power_service import orphans

    assert orphans(running, states, suspects) == want


@pytest.mark.parametrize(("raw", "ok"), [("", 60.0), ("5", 5.0), ("3600", 3600.0), ("4", None), ("x", None)])
def test_the_check_interval_is_bounded(monkeypatch: pytest.MonkeyPatch, raw: str, ok: float | None) -> None:
    from gpuprov.core.power_service import reconcile_every

    monkeypatch.setenv("GPUPROV_POWER_CHECK_S", raw)
    if ok is None:
        with pytest.raises(BadInput, match="GPUPROV_POWER_CHECK_S"):
            reconcile_every()
    else:
        assert reconcile_every() == ok


def test_the_service_log_is_kept_to_its_size_where_it_is_the_services_output(tmp_path: Path) -> None:
    """A real process whose output is the log (as `up` starts the service): past the limit the
    log becomes power.log.1 and the next line goes to a new power.log, 0600; a process writing
    elsewhere (a terminal, here a pipe) never moves the file."""
    import subprocess
    import sys

    log = tmp_path / elastic.LOG
    child = ("import sys; from gpuprov.core.power_service import rotate; "
             "print('x' * 300, flush=True); print(rotate(sys.argv[1], 100), file=sys.stderr, flush=True); "
             "print('after', flush=True)")
    with open(log, "ab") as out:
        subprocess.run([sys.executable, "-c", child, str(log)], stdout=out, stderr=subprocess.STDOUT, check=True)
    assert (tmp_path / f"{elastic.LOG}.1").read_text() == "x" * 300 + "\n"
    assert log.read_text() == "True\nafter\n" and log.stat().st_mode & 0o777 == 0o600
    log.write_text("y" * 300)  # past the limit, but not this process's output
    piped = subprocess.run([sys.executable, "-c", child, str(log)], capture_output=True, text=True, check=True)
    assert piped.stderr == "False\n" and log.read_text() == "y" * 300


# -- protected mode (gpuprov.core.elastic, "protected mode") ---------------------------------
@pytest.mark.parametrize(("raw", "ok"), [("", elastic.PROTECT_AFTER), ("1", 1), ("100", 100), ("0", None),
                                         ("101", None), ("3.5", None), ("-1", None), ("two", None)])
def test_the_count_of_failures_before_protected_mode_is_bounded(monkeypatch, raw: str, ok: int | None) -> None:
    monkeypatch.setenv("GPUPROV_POWER_PROTECT_AFTER", raw)
    if ok is None:
        with pytest.raises(BadInput, match="GPUPROV_POWER_PROTECT_AFTER"):
            elastic.protect_after()
    else:
        assert elastic.protect_after() == ok


def test_failed_resumes_in_a_row_reach_protected_mode_once() -> None:
    from gpuprov.core.power_service import failed

    record, protect = failed({}, 1, "resume failed: image gone", 3)
    assert (record["failures"], record["last"], record["partitions"], protect) == (1, "resume failed: image gone", [],
                                                                                  False)
    record, protect = failed(record, 2, "did not register within ResumeTimeout", 3)  # a hostlist of two
    assert (record["failures"], protect) == (3, True)
    # Once protected (the partitions recorded), more failures count but set nothing again.
    record, protect = failed({**record, "partitions": ["gpu"], "since": "2026-12-06T21:40:00Z"}, 1, "again", 3)
    assert (record["failures"], record["partitions"], record["since"], protect) == (4, ["gpu"],
                                                                                   "2026-12-06T21:40:00Z", False)


@pytest.mark.parametrize(("state", "up"), [("idle", True), ("allocated", True), ("mixed", True),
                                           ("completing", True), ("idle~", False), ("idle#", False),
                                           ("idle%", False), ("idle*", False), ("down~", False),
                                           ("drained", False), ("draining", False), ("down", False),
                                           ("allocated#", False), ("fail", False)])
def test_only_a_node_up_and_serving_begins_the_count_again(state: str, up: bool) -> None:
    from gpuprov.core.power_service import serving

    assert serving(state) is up


def test_the_protection_record_is_read_as_data_only(tmp_path: Path) -> None:
    files = ClusterFiles(tmp_path)
    assert elastic.protection(files) == {}
    elastic.write_protection(files, {"failures": 2, "last": "resume\x1b[31m failed", "since": "",
                                     "partitions": ["gpu", "p4d.24xlarge", "bad name", "-x", 7]})
    assert (tmp_path / elastic.PROTECTION).stat().st_mode & 0o777 == 0o600
    got = elastic.protection(files)
    assert got["failures"] == 2 and "\x1b" not in got["last"]
    assert got["partitions"] == ["gpu", "p4d.24xlarge"]  # never a word that could be an argument
    (tmp_path / elastic.PROTECTION).write_text("[1, 2]")
    assert elastic.protection(files) == {}
    elastic.write_protection(files, {})
    assert not (tmp_path / elastic.PROTECTION).exists()


def test_partitions_are_set_only_by_checked_names(tmp_path: Path) -> None:
    cluster = _cluster({})
    files = ClusterFiles(tmp_path)
    assert scheduler.set_partitions(cluster, files, ["gpu", "a b"], "INACTIVE").startswith("not partition names")
    assert scheduler.set_partitions(cluster, files, [], "UP").startswith("not partition names")
    with pytest.raises(ValueError):
        scheduler.set_partitions(cluster, files, ["gpu"], "DRAIN")
    assert scheduler.partitions_of(cluster, files, ["c-dy-1", "x;y"])[1].startswith("not node names")
    assert scheduler.power_down_force(cluster, files, ["c-dy-1 State=UP"]).startswith("not node names")


def test_the_recorded_protected_mode_reads_as_gpuprov_expects() -> None:
    """slurmctld 22.05.8's own words in protected mode and after it (the recording
    protected-mode.txt): the failed node DOWN with the service's reason, not serving; the
    node the requeued job ran on serving (the count of failures would begin again)."""
    text = (Path(__file__).parents[1] / "fixtures" / "recordings" / "slurm-22.05-debian12" /
            "protected-mode.txt").read_text()
    from gpuprov.core.power_service import serving

    blocks = [b.split("\n$ ", 1)[0] for b in text.split("$ sinfo -N -o '%N|%T|%E'\n")[1:]]
    first, _, last = (scheduler.parse_sinfo(b) for b in blocks)
    assert first["ela-e02e43-dy-1"].state == "down#"
    assert first["ela-e02e43-dy-1"].reason.startswith("gpuprov: resume failed: ")
    assert not any(serving(r.state) for n, r in first.items() if "-dy-" in n)
    assert [n for n, r in last.items() if "-dy-" in n and serving(r.state)] == ["ela-7d2cb2-dy-2"]
    # `sinfo`'s AVAIL of every partition while protected: inact (Slurm's word for INACTIVE)
    table = text.split("$ sinfo\n", 1)[1].split("\n$ ", 1)[0].splitlines()[1:]
    assert table and {row.split()[1] for row in table} == {"inact"}, table
    assert "(PartitionInactive)" in text


def test_a_dynamic_node_its_health_drained_is_powered_down_once_its_jobs_end() -> None:
    from gpuprov.core.power_service import unhealthy
    from gpuprov.results.shapes import SlurmNode

    nodes = {
        "c-dy-1": SlurmNode(state="drained", reason="gpuprov health: FAIL gpu_count: 7 of 8 GPUs"),
        "c-dy-2": SlurmNode(state="draining", reason="gpuprov health: FAIL xid: 79"),  # a job still runs
        "c-dy-3": SlurmNode(state="drained", reason="maintenance by hand"),  # someone else's drain
        "c-dy-4": SlurmNode(state="drained", reason="gpuprov patch: driver 580"),  # a roll's
        "c-dy-5": SlurmNode(state="drained~", reason="gpuprov health: FAIL"),  # already powered down
    }
    assert unhealthy(["c-dy-1", "c-dy-2", "c-dy-3", "c-dy-4", "c-dy-5", "c-dy-6"], nodes) == ["c-dy-1"]
    assert unhealthy([], nodes) == []


def test_a_slurm_bake_is_a_one_node_slurm_cluster_from_scratch_without_accounting() -> None:
    """`image bake --scheduler slurm` (the image an elastic AWS cluster's dynamic nodes boot
    from): its throwaway cluster is one node, from scratch, Slurm's own controller and compute
    node, with no accounting database baked in."""
    from gpuprov.core.baking import bake_spec

    spec = bake_spec("bake-abc123", "g5.xlarge", "aws", "us-east-1", slurm=True)
    assert spec.count == 1 and spec.instance_type == "g5.xlarge" and spec.region == "us-east-1"
    assert spec.options.no_baked is True
    assert spec.scheduler == Scheduler(kind="slurm", accounting=False)
    assert spec.scheduler.checked() == spec.scheduler
    assert bake_spec("bake-abc123", None, "docker", None).scheduler.kind == "none"


def test_replacing_unhealthy_nodes_round_trips_and_provision_keeps_or_ends_it() -> None:
    chosen = Scheduler(kind="slurm", max_count=4, replace=Replacement(plays=("rdma", "slurm"), health="off"))
    assert chosen.as_options()["slurm_replace_unhealthy"] == {"plays": ["rdma", "slurm"], "health": "off"}
    assert Scheduler.from_options(chosen.as_options()) == chosen
    # provision: kept where not given, replaced by this run's choice, ended by --no-replace-unhealthy
    assert elastic.merged(chosen, None, 6, None) == Scheduler(kind="slurm", max_count=6, replace=chosen.replace)
    assert elastic.merged(chosen, None, None, None, replace=Replacement(plays=())).replace == Replacement()
    assert elastic.merged(chosen, None, None, None, replace=False).replace is None
    assert elastic.merged(chosen, Scheduler(kind="none"), None, None) == Scheduler(kind="none")
    # (a recorded value of another shape is no choice)
    assert Replacement.from_option(["rdma"]) is None


@pytest.mark.parametrize(("chosen", "provider", "words"), [
    (Scheduler(kind="slurm", replace=Replacement()), "docker", "--replace-unhealthy goes with --scheduler slurm and "
                                                              "--max-count"),
    (Scheduler(kind="none", replace=Replacement()), "docker", "--replace-unhealthy goes with"),
    (Scheduler(kind="slurm", max_count=2, replace=Replacement()), "aws", "--replace-unhealthy on aws: not built yet"),
])
def test_replacing_unhealthy_nodes_that_cannot_be_is_one_line(chosen, provider, words) -> None:
    with pytest.raises(BadInput, match=words) as info:
        elastic.check(chosen.checked(), 2, get_provider(provider))
    assert "\n" not in str(info.value)


def test_only_static_nodes_their_health_drained_and_done_are_replaced_never_the_controller_or_database() -> None:
    from gpuprov.core.replace_unhealthy import candidates
    from gpuprov.results.shapes import SlurmNode

    names = ("c-node-1", "c-node-2", "c-node-3", "c-node-4", "c-node-5", "c-node-6")
    drained = SlurmNode(state="drained", reason="gpuprov health: FAIL gpu_count: 7 of 8 GPUs")
    nodes = {
        "c-node-1": drained,  # the controller
        "c-node-2": drained,  # the accounting database's node
        "c-node-3": drained,
        "c-node-4": SlurmNode(state="draining", reason="gpuprov health: FAIL xid: 79"),  # a job still runs
        "c-node-5": SlurmNode(state="drained", reason="gpuprov patch: driver 580"),  # a roll holds it
        "c-node-6": SlurmNode(state="drained", reason="by hand"),
        "c-dy-1": drained,  # a dynamic node: the service powers it down instead
    }
    options = {"scheduler": "slurm", "slurm_max_count": 8, "slurm_dbd": "c-node-2",
               "slurm_replace_unhealthy": {"plays": [], "health": "quick"}}
    assert candidates(_cluster(options, names), nodes) == [("c-node-3", drained.reason)]
    # without accounting the database's node is a node like the others
    assert [n for n, _ in candidates(_cluster({**options, "slurm_accounting": False,
                                                "slurm_dbd": None}, names), nodes)] == ["c-node-2", "c-node-3"]
    # a cluster that did not ask: none
    assert candidates(_cluster({"scheduler": "slurm", "slurm_max_count": 8}, names), nodes) == []


def test_up_of_an_existing_cluster_refuses_to_leave_an_elastic_flag_unapplied() -> None:
    from gpuprov.core.up import keeps_its_scheduler

    recorded = _cluster({"scheduler": "slurm", "slurm_max_count": 3, "slurm_idle_minutes": 1})
    keeps_its_scheduler(None, Scheduler(kind="slurm", max_count=9))  # a new cluster: its own choice
    keeps_its_scheduler(recorded, Scheduler(kind="slurm", max_count=3, idle_minutes=1))  # the same: growth
    keeps_its_scheduler(recorded, Scheduler(kind="none"))  # flags not given: the record stays
    with pytest.raises(BadInput, match="--scheduler would change it"):  # Slurm given to a cluster without it
        keeps_its_scheduler(_cluster({}), Scheduler(kind="slurm"))
    for chosen, flag in ((Scheduler(kind="slurm", max_count=4), "--max-count"),
                         (Scheduler(kind="slurm", max_count=3, idle_minutes=5), "--idle-minutes"),
                         (Scheduler(kind="slurm", max_count=3, replace=Replacement()), "--replace-unhealthy"),
                         (Scheduler(kind="slurm", controller="c-node-2"), "--slurm-controller"),
                         (Scheduler(kind="slurm", controller_only=True), "--slurm-controller-only"),
                         (Scheduler(kind="slurm", accounting=False), "--no-accounting")):
        with pytest.raises(BadInput, match=f"`up` keeps its recorded scheduler: {flag} would change it") as info:
            keeps_its_scheduler(recorded, chosen)
        assert f"`gpuprov provision c {flag} ...` does" in str(info.value) and "\n" not in str(info.value)


class _Baking:
    """FIXTURE: a provider of local nodes with images, short of Docker: ``images`` are the ones
    it lists, ``bake`` records what it baked (or fails, where ``fails`` says why)."""

    name = "docker"
    powers_from_controller = False

    def __init__(self, images: list, fails: str = "") -> None:
        self.images, self.fails, self.baked = list(images), fails, []

    def baked_images(self, region):
        return list(self.images)

    def bake(self, cluster, node, files, say):
        from gpuprov.errors import GpuprovError

        if self.fails:
            raise GpuprovError(self.fails)
        from types import SimpleNamespace

        image = SimpleNamespace(ref=f"img:{cluster.lock['hash']}", lock_hash=cluster.lock["hash"],
                                source=f"{cluster.name}/{node.name}")
        self.baked.append(node.name)
        self.images.append(image)
        return image


class _Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        self.lines.append(text)


def _elastic_record(store, options: dict, lock: str) -> None:
    store.create_cluster("c", "docker", {"options": options}, lock={"hash": lock})
    store.replace_nodes("c", list(_cluster(options).nodes))


def test_a_patch_that_moves_the_lock_bakes_the_dynamic_nodes_image_for_it(gpuprov_home, tmp_path) -> None:
    from types import SimpleNamespace

    from gpuprov.state import Store

    store = Store()
    _elastic_record(store, {"scheduler": "slurm", "slurm_max_count": 4, elastic.IMAGE_OPTION: "img:old"}, "new")
    provider = _Baking([SimpleNamespace(ref="img:old", lock_hash="old", source="c/c-node-2")])
    said = _Said()
    elastic.image_follows_lock(store, "c", provider, ClusterFiles(tmp_path), said)
    assert provider.baked == ["c-node-2"], said.lines  # the template node: the first that is not the controller
    assert elastic.image_of(store.get_cluster("c")) == "img:new"
    assert said.lines[0] == "c: the lock moved to new: the dynamic nodes' image follows it", said.lines
    # Again: the image of the lock is there, nothing is baked.
    elastic.image_follows_lock(store, "c", provider, ClusterFiles(tmp_path), said)
    assert provider.baked == ["c-node-2"]


def test_a_dynamic_image_that_cannot_follow_the_lock_is_said_not_raised(gpuprov_home, tmp_path) -> None:
    from gpuprov.state import Store

    store = Store()
    _elastic_record(store, {"scheduler": "slurm", "slurm_max_count": 4}, "new")
    said = _Said()
    elastic.image_follows_lock(store, "c", _Baking([], fails="docker commit: no space left"), ClusterFiles(tmp_path),
                               said)
    assert said.lines[-1] == ("c: warning: no image of lock new for its dynamic nodes (docker commit: no space left); "
                              "a resume is refused (the node set DOWN, saying why) until `gpuprov provision c` bakes "
                              "one"), said.lines
    # aws: the controller's service boots the AMI its set-up chose; the command that makes the new one is said.
    aws = _Baking([])
    aws.name, aws.powers_from_controller = "aws", True
    (tmp_path / "power-aws.json").write_text(json.dumps({"aws": {"config": {"image": "ami-0123456789abcdef0"}}}))
    said = _Said()
    elastic.image_follows_lock(store, "c", aws, ClusterFiles(tmp_path), said)
    assert aws.baked == [] and len(said.lines) == 1, said.lines
    assert said.lines[0].startswith("c: warning: its dynamic nodes boot ami-0123456789abcdef0 until an image of lock "
                                    "new is set up: `gpuprov image bake --provider aws --type docker-node "
                                    "--scheduler slurm`"), said.lines
    # A cluster without dynamic nodes: nothing to follow.
    store.create_cluster("s", "docker", {"options": {"scheduler": "slurm"}}, lock={"hash": "new"})
    said = _Said()
    elastic.image_follows_lock(store, "s", _Baking([]), ClusterFiles(tmp_path), said)
    assert said.lines == []


def test_a_dynamic_node_the_spot_watcher_drained_is_powered_down_once_its_jobs_are_gone() -> None:
    from gpuprov.results.shapes import SlurmNode
    from gpuprov.slurm import drain
    from gpuprov.slurm.power_rules import reclaimed

    nodes = {
        "c-dy-1": SlurmNode(state="drained", reason="spot interruption at 2026-12-07T23:30:00Z"),
        "c-dy-2": SlurmNode(state="draining", reason="spot interruption at soon"),  # within the watcher's grace
        "c-dy-3": SlurmNode(state="drained", reason="gpuprov health: FAIL xid: 79"),  # the health rule's
    }
    assert reclaimed(["c-dy-1", "c-dy-2", "c-dy-3", "c-dy-4"], nodes) == ["c-dy-1"]
    # The watcher's own words (the role's template) are the ones the rule reads.
    watcher = (Path(__file__).resolve().parents[2] / "roles" / "spot_interruption" / "templates"
               / "gpuprov-spot-watch.py.j2").read_text()
    assert f'f"Reason={drain.SPOT}{{when}}"' in watcher


def _replacing_service(monkeypatch, tried: list, marked: list, raises) -> None:
    """The service's replacement step with its own pieces short of nodes: the image check, the
    replacement (``raises`` raised from it) and Slurm's DOWN recorded here (FIXTURE)."""
    from gpuprov.core import power_service, replace_unhealthy

    def fake_replace(name, node, reason, image, *, console, store):
        tried.append(node)
        raise raises

    monkeypatch.setattr(power_service, "_image_for", lambda cluster, provider: "img:abc")
    monkeypatch.setattr(replace_unhealthy, "replace", fake_replace)
    monkeypatch.setattr(scheduler, "mark_down", lambda cluster, files, names, reason: marked.append((names, reason))
                        or "")
    monkeypatch.setattr(power_service, "_failed_replacements", set())


def test_a_replacement_that_fails_sets_the_node_down_with_why_and_is_not_tried_again(gpuprov_home, monkeypatch,
                                                                                       capsys) -> None:
    from gpuprov.core import power_service
    from gpuprov.errors import GpuprovError
    from gpuprov.results.shapes import SlurmNode
    from gpuprov.state import Store

    options = {"scheduler": "slurm", "slurm_max_count": 3, "slurm_accounting": False,
               "slurm_replace_unhealthy": {"plays": ["slurm"], "health": "off"}}
    _elastic_record(Store(), options, "abc")
    tried: list = []
    marked: list = []
    _replacing_service(monkeypatch, tried, marked, GpuprovError("the new c-node-2 did not converge"))
    nodes = {"c-node-2": SlurmNode(state="drained", reason="gpuprov health: FAIL gpu_count")}
    cluster = Store().get_cluster("c")
    power_service._replace_unhealthy(cluster, object(), nodes)
    power_service._replace_unhealthy(cluster, object(), nodes)  # the next check: not again
    assert tried == ["c-node-2"]
    assert marked == [(["c-node-2"], "replacement failed: the new c-node-2 did not converge")]
    out = capsys.readouterr().out
    assert "unhealthy c-node-2: drained by its own health (gpuprov health: FAIL gpu_count); replacing it" in out
    assert "unhealthy c-node-2: replacement failed: the new c-node-2 did not converge" in out


def test_a_replacement_another_command_holds_off_is_tried_at_the_next_check(gpuprov_home, monkeypatch,
                                                                             capsys) -> None:
    from gpuprov.core import power_service
    from gpuprov.errors import ClusterBusy
    from gpuprov.results.shapes import SlurmNode
    from gpuprov.state import Store

    options = {"scheduler": "slurm", "slurm_max_count": 3, "slurm_accounting": False,
               "slurm_replace_unhealthy": {"plays": [], "health": "quick"}}
    _elastic_record(Store(), options, "abc")
    tried: list = []
    marked: list = []
    _replacing_service(monkeypatch, tried, marked, ClusterBusy("cluster 'c' is busy: gpuprov provision c"))
    nodes = {"c-node-2": SlurmNode(state="drained", reason="gpuprov health: FAIL xid: 79")}
    power_service._replace_unhealthy(Store().get_cluster("c"), object(), nodes)
    power_service._replace_unhealthy(Store().get_cluster("c"), object(), nodes)
    assert tried == ["c-node-2", "c-node-2"] and marked == []  # nothing was done: no DOWN, tried again
    assert "unhealthy c-node-2: not replaced yet (cluster 'c' is busy: gpuprov provision c); at the next check" \
        in capsys.readouterr().out


def test_a_clusters_dynamic_containers_are_never_counted_or_started_as_its_nodes(monkeypatch) -> None:
    """FIXTURE: `docker ps`'s rows as the engine gives them. A dynamic node running while `up`
    grows the cluster (or replaces a node) was counted as one of its nodes: the new node was never
    made ("nodes did not start: count mismatch", seen by hand on 2026-12-07)."""
    from types import SimpleNamespace

    from gpuprov.providers import docker as local

    rows = [{"ID": "a", "Names": "gpuprov-c-node-1", "Labels": "gpuprov.cluster=c,gpuprov.node=c-node-1"},
            {"ID": "b", "Names": "gpuprov-c-dy-1", "Labels": "gpuprov.cluster=c,gpuprov.dynamic=1,gpuprov.node=c-dy-1"}]
    monkeypatch.setattr(local, "docker", lambda *args, **kw: SimpleNamespace(
        stdout="\n".join(json.dumps(r) for r in rows).encode()))
    assert [r["Names"] for r in local.PROVIDER._containers("c", dynamic=False)] == ["gpuprov-c-node-1"]
    assert len(local.PROVIDER._containers("c")) == 2  # `down` removes them all


@pytest.mark.parametrize("chosen", [
    Scheduler(kind="slurm", accounting=False, max_count=3, idle_minutes=1),
    Scheduler(kind="slurm", controller="c-node-2", controller_only=True, dbd="c-node-3"),
    Scheduler(kind="slurm", max_count=2, replace=Replacement(plays=("slurm",), health="off")),
    Scheduler(kind="none"),
])
def test_a_new_clusters_record_keeps_its_whole_scheduler_choice(chosen) -> None:
    """`up`'s record of a new cluster (ClusterSpec.as_dict) read back: --no-accounting was lost
    there (a False dropped with the unset flags), so a later `provision` turned accounting on
    (found 2026-12-07 by the replacement's `up` of the elastic e2e cluster)."""
    from gpuprov.providers.spec import ClusterSpec

    spec = ClusterSpec(name="c", provider="docker", instance_type=None, count=2, scheduler=chosen)
    assert ClusterSpec.from_record("c", "docker", spec.as_dict()).scheduler == chosen
