"""The full level's run across nodes: NVIDIA nccl-tests' ``all_reduce_perf``, one rank per GPU on
every node, judged against the type's published two-node floor (gpuprov.health.floors) by
gpuprov.health.nccl.bandwidth_check: under Slurm's ``srun`` on a cluster that runs Slurm, else
under Open MPI's ``mpirun``.

On a Slurm cluster (``--scheduler slurm``) the run is one job step from the first node, as the
login user: ``srun --nodelist=<the nodes> --ntasks-per-node=G --gpus-per-node=G --mpi=pmix``
(Slurm's PMIx plugin wires up Debian's Open MPI: proven on local nodes by
tests/e2e/test_slurm_e2e.py), its environment the job's own (the lock's NCCL settings through
the task prolog) plus ``FI_PROVIDER=efa`` on EFA types. No key is made or copied: Slurm starts
the ranks, munge authenticates them. The job waits for its nodes like any other (a busy cluster
queues it) within the same budget.

Without Slurm:

mpirun starts its ranks on the other nodes over SSH from the first node (the launcher), so for
the length of one run gpuprov gives the nodes a way in to each other, and takes it away after:

- a key pair made for this run only, its private half on the launcher in a directory on a
  memory file system (/dev/shm, mode 0700: never on a disk), its public half added to the login
  user's authorized_keys on every other node, limited to the launcher's address (``from=``; mpirun
  starts every remote daemon from the launcher: no tree spawn), with no forwarding, marked
  with the run's id and with an expiry (gpuprov.health.mpi_key says how the line is added,
  removed and expired);
- the other nodes' host keys, the ones gpuprov pinned for them (the cluster's known_hosts),
  written for their cluster addresses into the launcher's known_hosts for the run: mpirun's
  ssh checks them (StrictHostKeyChecking=yes), as every SSH connection of gpuprov does;
- afterwards (also when the run fails, times out, or gpuprov gets SIGTERM or SIGINT): the
  run's key line removed from every node (each tried whatever happened on the others; a node
  where it could not be is named in the row), the launcher's directory and what is left of
  the run there removed.

Nothing a user typed reaches a command: the addresses are the nodes' own readings, checked to
be IPv4 addresses; the counts are ints; the run's id is hex that gpuprov makes.
"""

from __future__ import annotations

import io
import ipaddress
import secrets
import shlex
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from gpuprov.health import mpi_key, nccl
from gpuprov.health.checks_gpu import failed, skipped
from gpuprov.health.facts import Expect, Facts
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import HealthCheck
from gpuprov.slurm.drain import NAME as SLURM_NAME
from gpuprov.ssh import node_key, pinned_key, ssh_options
from gpuprov.state import NodeRecord

CHECK = "nccl_allreduce_cluster"
NODE = "cluster"  # the row's node: the run is the cluster's, not one node's
BUDGET_S = 900
MARK = mpi_key.MARK
EXPECTED = "all_reduce_perf across all the nodes (one rank per GPU): no wrong result, busbw at the type's floor"


@dataclass(frozen=True)
class Peer:
    node: NodeRecord
    address: str  # where the other nodes reach it (its default route's address)
    gpus: int
    slurm_name: str = ""  # its Slurm NodeName (short hostname), read by the full level


def peers(nodes: Sequence[NodeRecord], facts: Mapping[str, Facts], expected: Mapping[str, Expect]
          ) -> tuple[list[Peer], HealthCheck | None]:
    """The nodes of the run, or the row that says why there is none (a skip where no run can
    be, a failure where one should be and cannot)."""
    if len(nodes) < 2:
        return [], skipped(CHECK, "one node: nothing to run across nodes (inside the node: nccl_allreduce_node)",
                           EXPECTED)
    out: list[Peer] = []
    for node in nodes:
        seen = facts.get(node.name)
        if seen is None:
            return [], failed(CHECK, f"{node.name} could not be read", "every node answers",
                              "bring the node back, or leave it out with --node")
        gpus = seen.gpus_on_bus
        if not gpus and not expected[node.name].gpus:
            return [], skipped(CHECK, f"{node.name}: no NVIDIA GPU on the PCI bus", EXPECTED)
        address = seen.text("cluster_address").strip()
        try:
            ok = ipaddress.IPv4Address(address) and not ipaddress.IPv4Address(address).is_unspecified
        except ValueError:
            ok = False
        if not ok:
            return [], failed(CHECK, f"{node.name}: no address on its default route ({address[:60]!r})",
                              "every node's own IPv4 address on its default route",
                              "check the node's network (ip route)")
        if seen.rc("mpirun") != 0:
            return [], failed(CHECK, f"{node.name}: mpirun is not installed", "Open MPI on every node",
                              f"run the nccl_tests play ({expected[node.name].provision} --tags nccl_tests)")
        out.append(Peer(node, address, gpus, seen.text("slurm_name").strip()))
    if len({p.gpus for p in out}) > 1:
        return [], failed(CHECK, "GPU counts differ: " + ", ".join(f"{p.node.name} {p.gpus}" for p in out),
                          "the same GPUs on every node", "check the nodes' gpu_count rows")
    return out, None


def _ssh(node: NodeRecord, files: ClusterFiles, remote: str) -> list[str]:
    return ["ssh", "-p", str(node.ssh_port), *ssh_options(files.known_hosts, node_key(node, files.login_key)),
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ControlMaster=no", "-o", "ControlPath=none",
            "--", f"{node.user}@{node.address}", remote]


def _known_hosts(group: Sequence[Peer], files: ClusterFiles) -> str:
    lines = []
    for p in group:
        key = pinned_key(files.known_hosts, p.node.address, p.node.ssh_port)
        if not key:
            raise RuntimeError(f"{p.node.name}: no pinned host key in {files.known_hosts}")
        lines.append(f"{p.address} {key}")
    return "\n".join(lines) + "\n"


def _bundle(entries: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True)
class MpiRun:
    """What one run under mpirun came to."""

    rc: int | None  # mpirun's exit status; None: past its budget, or never started (``setup``)
    output: str
    setup: str = ""  # why the run could not start ("node: why"), "" when it started
    left: tuple[str, ...] = ()  # "node: why" for each node the run's key could not be removed from
    run_id: str = ""
    expires: str = ""  # when the run's key stops working (YYYYMMDDHHMMZ)


def mpi_run(group: Sequence[Peer], files: ClusterFiles, program: Sequence[str], *, ranks_per_node: int,
            env: Sequence[str] = (), timeout: int = BUDGET_S) -> MpiRun:
    """``program`` under mpirun on ``group`` (launched from the first), ``ranks_per_node`` ranks
    on each, within ``timeout``. ``program`` and ``env`` (NAME=VALUE for -x) are gpuprov's
    constants, quoted all the same. The run's key is taken away from every node before this
    returns, also on SIGTERM or SIGINT (then ``mpi_key.Interrupted`` is raised after it)."""
    run_id = mpi_key.new_run_id(secrets.token_hex(6))
    shm = f"/dev/shm/{run_id}"
    launcher = group[0]
    expires = mpi_key.expiry(datetime.now(UTC))
    ran, line = MpiRun(None, "", run_id=run_id, expires=expires), ""
    with mpi_key.Guard() as guard:  # from the key's making: a signal never leaves a half of it anywhere
        try:
            try:
                with tempfile.TemporaryDirectory(prefix=run_id,
                                                 dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
                    key = Path(tmp) / "id"
                    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", run_id, "-f", str(key)],
                                   check=True, stdin=subprocess.DEVNULL, capture_output=True)
                    # Only the launcher logs in to the others (no tree spawn: plm_rsh_no_tree_spawn below).
                    line = mpi_key.key_line(key.with_suffix(".pub").read_text(), run_id, [launcher.address], expires)
                    bundle = _bundle({"id": key.read_bytes(), "known_hosts": _known_hosts(group, files).encode(),
                                      "hostfile": "".join(f"{p.address} slots={ranks_per_node}\n"
                                                          for p in group).encode()})
                ran = _launch(group, files, program, line, bundle, shm, ranks_per_node, env, timeout, ran)
            finally:
                guard.disarm()  # from here on a signal is noted: the cleanup below always runs whole
        finally:
            left = mpi_key.remove_everywhere(
                [(p.node.name, _ssh(p.node, files, mpi_key.remote("remove", run_id))) for p in group],
                line) if line else []
            if guard.caught is not None:
                raise guard.interrupted(left, run_id, expires) from None
    return replace(ran, left=tuple(left))


def _launch(group: Sequence[Peer], files: ClusterFiles, program: Sequence[str], line: str, bundle: bytes,
            shm: str, ranks_per_node: int, env: Sequence[str], timeout: int, ran: MpiRun) -> MpiRun:
    launcher = group[0]
    for p in group[1:]:  # the launcher starts its own ranks itself: its sshd is not asked
        why = mpi_key.add(_ssh(p.node, files, mpi_key.remote("add", ran.run_id)), line)
        if why is not None:
            return replace(ran, setup=f"{p.node.name}: could not add the run's key to authorized_keys: {why}")
    try:
        proc = subprocess.run(_ssh(launcher.node, files, f"umask 077; mkdir -p {shm} && tar -xf - -C {shm}"),
                              input=bundle, capture_output=True, check=False, timeout=60)
        why = None if proc.returncode == 0 else proc.stderr.decode(errors="replace").strip()[-200:]
    except subprocess.TimeoutExpired:
        why = "no answer within 60 s"
    if why is not None:
        return replace(ran, setup=f"{launcher.node.name}: could not copy the run's key to {shm}: {why}")
    agent = (f"ssh -i {shm}/id -o UserKnownHostsFile={shm}/known_hosts -o StrictHostKeyChecking=yes "
             "-o IdentitiesOnly=yes -o BatchMode=yes")
    exports = " ".join(f"-x {shlex.quote(e)}" for e in env)
    command = (f'[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; '
               f"timeout {int(timeout)} mpirun --hostfile {shm}/hostfile "
               f"-np {len(group) * int(ranks_per_node)} --map-by ppr:{int(ranks_per_node)}:node --bind-to none "
               f"--mca plm_rsh_agent {shlex.quote(agent)} --mca plm_rsh_no_tree_spawn 1 {exports} "
               f"{shlex.join(program)} 2>&1")
    try:
        mpirun = subprocess.run(_ssh(launcher.node, files, command), capture_output=True, text=True,
                                timeout=timeout + 60, check=False)
    except subprocess.TimeoutExpired:
        return ran
    return replace(ran, rc=None if mpirun.returncode == 124 else mpirun.returncode,
                   output=mpirun.stdout + mpirun.stderr)


def srun_command(group: Sequence[Peer], program: Sequence[str], *, ranks_per_node: int,
                 env: Sequence[str] = (), timeout: int = BUDGET_S) -> str:
    """The one command the first node runs for a run under Slurm (its words gpuprov's constants,
    the nodes' Slurm names, read from them and checked, and ints)."""
    bad = [p.node.name for p in group if not SLURM_NAME.fullmatch(p.slurm_name)]
    if bad:
        raise ValueError(f"no Slurm node name read from {', '.join(bad)}")
    ranks = int(ranks_per_node)
    return (f"timeout {int(timeout)} srun --job-name=gpuprov-health --nodes={len(group)} "
            f"--nodelist={','.join(p.slurm_name for p in group)} --ntasks-per-node={ranks} "
            f"--gpus-per-node={ranks} --mpi=pmix --export={shlex.quote(','.join(['ALL', *env]))} "
            f"{shlex.join(program)} 2>&1")


def srun_run(group: Sequence[Peer], files: ClusterFiles, program: Sequence[str], *, ranks_per_node: int,
             env: Sequence[str] = (), timeout: int = BUDGET_S) -> MpiRun:
    """``program`` as one Slurm job step over ``group``, started on its first node."""
    try:
        command = srun_command(group, program, ranks_per_node=ranks_per_node, env=env, timeout=timeout)
    except ValueError as exc:
        return MpiRun(None, "", setup=str(exc))
    try:
        proc = subprocess.run(_ssh(group[0].node, files, command), capture_output=True, text=True,
                              timeout=timeout + 60, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return MpiRun(None, "")
    return MpiRun(None if proc.returncode == 124 else proc.returncode, proc.stdout + proc.stderr)


def across_nodes(nodes: Sequence[NodeRecord], facts: Mapping[str, Facts], expected: Mapping[str, Expect],
                 files: ClusterFiles, run_dir: Path, launcher: str = "mpirun") -> HealthCheck:
    """The full level's cluster row: all_reduce_perf over every GPU of every node, under
    ``launcher`` (``srun`` on a cluster that runs Slurm, else ``mpirun``)."""
    group, why = peers(nodes, facts, expected)
    if why is not None:
        return _cluster(why)
    first = expected[group[0].node.name]
    env = ["FI_PROVIDER=efa"] if first.efa_interfaces else []
    program = ["sh", "-c", 'exec "$(command -v all_reduce_perf || echo /opt/nccl-tests/build/all_reduce_perf)" '
               '-b 8 -e 2G -f 2 -g 1']
    start = srun_run if launcher == "srun" else mpi_run
    ran = start(group, files, program, ranks_per_node=group[0].gpus, env=env)
    (run_dir / "nccl-across-nodes.txt").write_text(ran.output)
    where = f"{len(group)} nodes x {group[0].gpus} GPUs"
    if ran.setup:
        row = failed(CHECK, f"all_reduce_perf across {where} could not start: {ran.setup}", EXPECTED,
                     "check the node named (its disk, its ~/.ssh) and run the full level again")
    elif ran.rc is None:
        row = failed(CHECK, f"all_reduce_perf across {where} did not finish in {BUDGET_S} s", EXPECTED,
                     "drain the nodes and run the in-node check on each (--level standard): a "
                     "collective that hangs across nodes points at the network (EFA, security group)")
    else:
        row = nccl.bandwidth_check(NODE, ran.output, instance_type=first.instance_type, nodes=len(group))
        if ran.rc != 0 and row.status == "pass":
            text = ran.output.strip()
            row = failed(CHECK, f"{launcher} exited {ran.rc}: {text.splitlines()[-1][:200] if text else ''}",
                         EXPECTED, "read the raw output (nccl-across-nodes.txt in the run's directory)")
    if ran.left:
        found = mpi_key.left_line(ran.left, ran.run_id, ran.expires)
        row = failed(CHECK, f"{row.found}; {found}" if row.status == "fail" else found, EXPECTED,
                     f"remove the line ending in {ran.run_id} from ~/.ssh/authorized_keys on the nodes named "
                     "(or leave it: it opens nothing after its expiry)")
    return _cluster(row)


def one_node() -> HealthCheck:
    """The row of a check on one machine (--local): nothing to run across nodes."""
    return _cluster(peers([], {}, {})[1])


def _cluster(row: HealthCheck | None) -> HealthCheck:
    assert row is not None
    return replace(row, node=NODE, check=CHECK)
