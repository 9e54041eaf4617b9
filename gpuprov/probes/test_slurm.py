"""Probes for Slurm (role slurm): the cluster's munge key in place and working, slurmctld on the
controller and slurmd on every compute node active and at one version, the node up in `sinfo`,
a job answering on it through `srun`, every task given the cluster's environment, the
node's GRES matching the GPUs on its PCI bus, and (with accounting) slurmdbd answering and its
database kept to its host.

A node of a cluster without Slurm (`up --scheduler none`, expectation "scheduler": "none")
cannot have any of it: each probe skips there, saying so. With "scheduler": "slurm" a node
without slurm.conf fails."""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass

import pytest

from gpuprov.probes import conftest
from gpuprov.probes.nodefacts import file_stat, nvidia_pci, once, read_text, require_systemd, unit_state

pytestmark = pytest.mark.slurm

CONF = "/etc/slurm/slurm.conf"
MUNGE_KEY = "/etc/munge/munge.key"
TASK_ENV = "/etc/slurm/gpuprov-task-env"
# Node states (sinfo %t) of a node that takes work: idle, partly or fully allocated, completing.
UP_STATES = ("idle", "mix", "alloc", "comp")
UP_WAIT_S = 90


@dataclass(frozen=True)
class SlurmNode:
    name: str
    controller: str
    compute: tuple[str, ...]
    # `gpuprov patch` on a Slurm cluster probes a node it drained itself before resuming it:
    # the Reason its drain wrote starts with this ("gpuprov patch"); "" everywhere else.
    drained_by: str = ""

    @property
    def is_controller(self) -> bool:
        return self.name == self.controller

    @property
    def is_compute(self) -> bool:
        return self.name in self.compute


def parse_conf(text: str) -> tuple[str, tuple[str, ...]]:
    """(the controller's name, the compute nodes' names) of a slurm.conf."""
    controller = re.search(r"^\s*SlurmctldHost=([^\s(#]+)", text, re.M | re.I)
    nodes = re.findall(r"^\s*NodeName=([^\s#]+)", text, re.M | re.I)
    names = tuple(n for line in nodes for n in line.split(",") if n and n.upper() != "DEFAULT")
    return (controller.group(1) if controller else ""), names


@pytest.fixture
def slurm(host, node) -> SlurmNode:
    """This node's part in the cluster's Slurm, read from its slurm.conf."""
    data = conftest._EXPECTATIONS.get(node) or conftest._EXPECTATIONS.get("*") or {}
    scheduler = data.get("scheduler")
    if scheduler not in (None, "slurm"):
        pytest.skip(f"this cluster runs no Slurm (scheduler {scheduler!r}): nothing to check")
    # slurm.conf and the node's name, read once per probe session (probes change neither).
    conf, name = once(host, "slurm", lambda: (read_text(host, CONF), host.run("hostname -s").stdout.strip()))
    if conf is None:
        if scheduler == "slurm":
            raise AssertionError(f"expected Slurm's configuration {CONF} (cluster scheduler slurm), found none")
        pytest.skip(f"no Slurm on this node (no {CONF}): a cluster without a scheduler")
    controller, compute = parse_conf(conf)
    return SlurmNode(name=name, controller=controller, compute=compute,
                     drained_by=str(data.get("slurm_drained_by") or ""))


def _drained_by_the_roll(host, slurm: SlurmNode) -> str:
    """The node's drain Reason when the roll that runs these probes drained it (its Reason
    starts with the roll's words), else ""."""
    if not slurm.drained_by:
        return ""
    state = host.run(f"sinfo -h -N -n {shlex.quote(slurm.name)} -o '%T|%E'").stdout.strip().splitlines()
    status, _, reason = (state[0] if state else "").partition("|")
    return reason if "drain" in status and reason.startswith(slurm.drained_by) else ""


def _need_jobs(host, slurm: SlurmNode) -> None:
    """Skip where the roll running these probes drained the node itself; fail at once where the
    node takes no work for another reason (a drain by anyone else, down): no job could land there,
    and waiting out `srun`'s timeout would only say so two minutes later."""
    _need_compute(slurm)
    reason = _drained_by_the_roll(host, slurm)
    if reason:
        pytest.skip(f"{slurm.name} is drained by the roll that runs these probes ({reason}): no job runs "
                    "there until its gate passes and it is resumed")
    state, why = _settled_state(host, slurm.name)
    assert state in UP_STATES, (
        f"expected {slurm.name} to take a job, found it '{state}' in sinfo"
        + (f" (reason: {why})" if why else "") + ": no job can run there")


def _settled_state(host, name: str) -> tuple[str, str]:
    """(sinfo's state, the Reason) of ``name``, once the controller has settled it: a node not
    responding yet (a trailing ``*``) or of unknown state is waited for, up to UP_WAIT_S; a
    drained or down node with a Reason is a decision (a person's, Slurm's, a health check's) and is
    returned at once."""
    deadline = time.monotonic() + UP_WAIT_S
    while True:
        line, err = _state(host, name)
        state = line.split("|")[0] or err
        reason = host.run(f"sinfo -h -R -n {shlex.quote(name)} -o '%E'").stdout.strip()
        if state in UP_STATES or time.monotonic() >= deadline:
            return state, reason
        if reason and not state.endswith("*") and not state.startswith("unk"):
            return state, reason
        time.sleep(2)


def _need_compute(slurm: SlurmNode) -> None:
    if not slurm.is_compute:
        pytest.skip(f"{slurm.name} is the controller only: slurm.conf has no NodeName line for it (no slurmd)")


def test_munge_key_is_0400_and_owned_by_munge(host, slurm, report):
    key = file_stat(host, MUNGE_KEY)
    assert key and key.kind == "regular file", f"expected the cluster's munge key at {MUNGE_KEY}, found none"
    found = f"mode {key.mode:04o}, {key.user}:{key.group}"
    assert key.mode == 0o400 and key.user == "munge" and key.group == "munge", (
        f"expected {MUNGE_KEY} mode 0400 owned by munge:munge, found {found}")
    assert key.size >= 32, f"expected a munge key of at least 32 bytes, found {key.size}"
    report(f"{MUNGE_KEY}: {found}, {key.size} bytes")


def test_munge_encodes_and_decodes_a_credential(host, slurm, report):
    require_systemd(host)
    munge = unit_state(host, "munge")
    assert munge.is_running, f"expected munge running, found {munge}"
    cred = host.run("munge -n | unmunge")
    assert cred.rc == 0 and re.search(r"^STATUS:\s+Success", cred.stdout, re.M), (
        f"expected `munge -n | unmunge` to succeed, found rc {cred.rc}: {(cred.stdout + cred.stderr)[-300:]}")
    report("munge -n | unmunge: Success")


def test_slurmctld_active_on_the_controller(host, slurm, report):
    if not slurm.is_controller:
        pytest.skip(f"{slurm.name} is not the controller (SlurmctldHost={slurm.controller}): no slurmctld here")
    require_systemd(host)
    service = unit_state(host, "slurmctld")
    assert service.is_enabled and service.is_running, (
        f"expected slurmctld enabled and running on the controller {slurm.name}, found {service}")
    ping = host.run("scontrol ping")
    assert ping.rc == 0 and "UP" in ping.stdout, f"expected `scontrol ping` UP, found: {ping.stdout}{ping.stderr}"
    report(f"slurmctld running; {ping.stdout.strip()}")


def test_slurmd_active_on_a_compute_node(host, slurm, report):
    _need_compute(slurm)
    require_systemd(host)
    service = unit_state(host, "slurmd")
    assert service.is_enabled and service.is_running, (
        f"expected slurmd enabled and running on {slurm.name}, found {service}")
    report("slurmd enabled and running")


def _version(text: str) -> str:
    match = re.search(r"(\d+\.\d+\.\d+)", text)
    return match.group(1) if match else f"unreadable ({text.strip()[:80]!r})"


def test_slurm_daemons_run_one_version(host, slurm, report):
    config = host.run("scontrol show config")
    assert config.rc == 0, f"expected the controller's configuration from `scontrol show config`: {config.stderr}"
    controller = re.search(r"^SLURM_VERSION\s*=\s*(\S+)", config.stdout, re.M)
    assert controller, f"expected SLURM_VERSION in `scontrol show config`, found: {config.stdout[:300]}"
    found = {"the controller's (scontrol show config)": controller.group(1)}
    if slurm.is_controller:
        found["slurmctld -V here"] = _version(host.run("slurmctld -V").stdout)
    if slurm.is_compute:
        found["slurmd -V here"] = _version(host.run("slurmd -V").stdout)
    assert len(set(found.values())) == 1, f"expected one Slurm version, found {found}"
    report(f"Slurm {next(iter(found.values()))} ({', '.join(found)})")


def _state(host, name: str) -> tuple[str, str]:
    out = host.run(f"sinfo -h -N -n {shlex.quote(name)} -o '%t|%c|%m|%G'")
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "", out.stderr.strip()


def test_node_takes_work_in_sinfo(host, slurm, report):
    _need_compute(slurm)
    own = _drained_by_the_roll(host, slurm)
    if own:
        report(f"sinfo: {slurm.name} drained by this roll ({own}): resumed once its gate passes")
        return
    state, reason = _settled_state(host, slurm.name)
    assert state in UP_STATES, (
        f"expected {slurm.name} {'/'.join(UP_STATES)} in sinfo (waiting up to {UP_WAIT_S} s while it is not "
        f"responding), found '{state}'" + (f" (reason: {reason})" if reason else ""))
    line, _ = _state(host, slurm.name)
    _, cpus, memory, gres = [*line.split("|"), "", "", ""][:4]
    report(f"sinfo: {slurm.name} {state}, {cpus} CPUs, {memory} MiB, gres {gres}")


def test_srun_runs_a_task_on_this_node(host, slurm, report):
    _need_jobs(host, slurm)
    run = host.run(f"timeout 120 srun -N1 -w {shlex.quote(slurm.name)} hostname -s")
    assert run.rc == 0 and run.stdout.strip() == slurm.name, (
        f"expected `srun -N1 -w {slurm.name} hostname -s` to answer {slurm.name}, found rc {run.rc}: "
        f"{(run.stdout + run.stderr).strip()[-300:]}")
    report(f"srun -N1 -w {slurm.name} hostname -s: {run.stdout.strip()}")


def test_every_task_gets_the_clusters_environment(host, slurm, report):
    _need_jobs(host, slurm)
    env_text = read_text(host, TASK_ENV)
    if env_text is None:
        pytest.skip(f"no task environment on {slurm.name} (no {TASK_ENV}: slurm_task_env is empty)")
    wanted = dict(line[len("export "):].split("=", 1) for line in env_text.splitlines()
                  if line.startswith("export ") and "=" in line)
    run = host.run(f"timeout 120 srun -N1 -w {shlex.quote(slurm.name)} env")
    assert run.rc == 0, f"expected `srun env` to run on {slurm.name}, found rc {run.rc}: {run.stderr[-300:]}"
    got = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    wrong = {k: got.get(k) for k, v in wanted.items() if got.get(k) != v}
    assert not wrong, f"expected every task to get {wanted}, a task saw {wrong}"
    report(f"a task sees {', '.join(sorted(wanted))}")


def test_gres_matches_the_gpus_on_the_pci_bus(host, slurm, report):
    _need_compute(slurm)
    gpus = nvidia_pci(host)["gpus"]
    if gpus == 0:
        pytest.skip(f"no NVIDIA GPU on {slurm.name}'s PCI bus: no GRES to check")
    shown = host.run(f"scontrol show node {shlex.quote(slurm.name)}").stdout
    gres = re.search(r"\bGres=(\S+)", shown)
    count = re.search(r"gpu(?::[^:,(\s]+)?:(\d+)", gres.group(1)) if gres else None
    assert count and int(count.group(1)) == gpus, (
        f"expected Gres=gpu:...:{gpus} ({gpus} GPU(s) on the PCI bus), found {gres.group(1) if gres else 'none'}")
    report(f"Gres={gres.group(1)}, {gpus} GPU(s) on the PCI bus")


DBD_CONF = "/etc/slurm/slurmdbd.conf"
MARIADB_PORT = 3306


def _conf_value(text: str, key: str) -> str:
    found = re.search(rf"^\s*{key}\s*=\s*(\S+)", text, re.M | re.I)
    return found.group(1) if found else ""


def test_accounting_records_to_slurmdbd(host, slurm, report):
    """With accounting (slurm.conf's AccountingStorageType is slurmdbd): slurmdbd answers this
    node and knows the cluster; on the dbd host (it has slurmdbd.conf), slurmdbd and MariaDB run,
    slurmdbd.conf is 0600 slurm's (it holds the database password) and MariaDB listens on
    loopback alone."""
    conf = read_text(host, CONF) or ""
    if _conf_value(conf, "AccountingStorageType") != "accounting_storage/slurmdbd":
        pytest.skip(f"no accounting on this cluster ({CONF}: AccountingStorageType "
                    f"{_conf_value(conf, 'AccountingStorageType') or 'unset'})")
    cluster = _conf_value(conf, "ClusterName").lower()
    listed = host.run("sacctmgr --noheader --parsable2 list cluster format=cluster")
    assert listed.rc == 0 and cluster in listed.stdout.split(), (
        f"expected slurmdbd to answer `sacctmgr list cluster` with {cluster!r}, found rc {listed.rc}: "
        f"{(listed.stdout + listed.stderr).strip()[-300:]}")
    stat = file_stat(host, DBD_CONF)
    if stat is None:
        report(f"slurmdbd ({_conf_value(conf, 'AccountingStorageHost')}) knows cluster {cluster}")
        return
    require_systemd(host)
    for unit in ("slurmdbd", "mariadb"):
        service = unit_state(host, unit)
        assert service.is_enabled and service.is_running, f"expected {unit} enabled and running, found {service}"
    assert (stat.mode, stat.user) == (0o600, "slurm"), (
        f"expected {DBD_CONF} 0600 owned by slurm (it holds the database password), found "
        f"{oct(stat.mode)} {stat.user}")
    listening = host.run(f"ss -ltnH 'sport = :{MARIADB_PORT}'").stdout.split("\n")
    local = [line.split()[3] for line in listening if line.strip()]
    assert local and all(a.startswith(("127.", "[::1]")) for a in local), (
        f"expected MariaDB on loopback alone, found it listening on {local or 'nothing'}")
    report(f"slurmdbd and MariaDB running here, cluster {cluster} known, {DBD_CONF} 0600 slurm, "
           f"MariaDB on {', '.join(local)}")
