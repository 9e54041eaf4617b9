"""A cluster's scheduler (`up --scheduler slurm`, `provision NAME --scheduler slurm`): the
choice as the cluster's record keeps it, its checks, the cluster's munge key and the variables
the slurm play (playbooks/slurm.yml) reads.

The munge key is made here, by gpuprov, never by a node: 1024 random bytes in the cluster's
private directory (0700, beside its SSH key), mode 0600 (gpuprov.slurm.munge). The role copies
it to each node over the pinned SSH connection (no_log); the key's bytes are never a variable,
so they are in no extravars file, run artifact, log or state row.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

from gpuprov import defaults, ssh
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.scheduler_choice import Scheduler
from gpuprov.shared.results import SlurmNode, SlurmStatus
from gpuprov.slurm import munge
from gpuprov.state import ClusterRecord, NodeRecord, Store

MUNGE_KEY = "munge.key"


def of(cluster: ClusterRecord) -> Scheduler:
    """The scheduler a cluster's record says it has (none for a record from before)."""
    options = cluster.spec.get("options") or {}
    return Scheduler(kind=options.get("scheduler") or defaults.DEFAULT_SCHEDULER,
                     controller=options.get("slurm_controller"),
                     controller_only=bool(options.get("slurm_controller_only")))


def record(store: Store, cluster: ClusterRecord, chosen: Scheduler) -> ClusterRecord:
    """``chosen`` written into the cluster's record (after checking its controller is a node)."""
    controller_of(cluster, chosen)
    options = {k: v for k, v in (cluster.spec.get("options") or {}).items()
               if k not in ("scheduler", "slurm_controller", "slurm_controller_only")}
    store.set_spec(cluster.name, {**cluster.spec, "options": {**options, **chosen.checked().as_options()}})
    found = store.get_cluster(cluster.name)
    assert found is not None
    return found


def controller_of(cluster: ClusterRecord, chosen: Scheduler | None = None) -> str:
    """The controller's node name: the one asked for, else the cluster's first node."""
    chosen = chosen or of(cluster)
    names = [n.name for n in cluster.nodes]
    if chosen.controller is not None and chosen.controller not in names:
        raise BadInput(f"--slurm-controller {chosen.controller}: no node of cluster '{cluster.name}' "
                       f"has that name ({', '.join(names) or 'it has none'})")
    if not names:
        raise BadInput(f"cluster '{cluster.name}' has no nodes to run Slurm on")
    return chosen.controller or names[0]


def play_vars(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
              say: Any = None) -> dict[str, Any]:
    """The slurm play's variables for a run on ``nodes``. slurm.conf lists the play's hosts, so
    Slurm is configured only by a run on every node of the cluster; a run on some of them (new
    nodes of `up`, a replacement) leaves it as it is and says so."""
    chosen = of(cluster)
    if chosen.kind != "slurm":
        return {"gpuprov_scheduler": "none"}
    if {n.name for n in nodes} != {n.name for n in cluster.nodes}:
        if say is not None:
            say(f"  slurm: this run converges {len(nodes)} of the cluster's {len(cluster.nodes)} node(s); "
                f"`gpuprov provision {cluster.name}` adds them to Slurm")
        return {"gpuprov_scheduler": "none"}
    key = munge.ensure_key(files.dir / MUNGE_KEY)
    return {"gpuprov_scheduler": "slurm", "gpuprov_slurm_controller": controller_of(cluster, chosen),
            "gpuprov_slurm_controller_only": chosen.controller_only, "gpuprov_slurm_munge_key": str(key)}


# What `status` asks the controller: each node's state and reason, one line each (a fixed
# command, quoted for the node's shell: nothing of the user's reaches it).
SINFO = ("sinfo", "--noheader", "--Node", "--format=%N|%T|%E")


def slurm_status(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord]) -> SlurmStatus | None:
    """Each node's Slurm state and reason, asked of the controller over its pinned SSH
    connection (None where the cluster runs no Slurm; ``error`` where the controller did not
    answer)."""
    chosen = of(cluster)
    if chosen.kind != "slurm":
        return None
    try:
        controller = controller_of(cluster, chosen)
    except BadInput as exc:
        return SlurmStatus(controller=chosen.controller or "", nodes={}, error=str(exc))
    node = next((n for n in nodes if n.name == controller), None)
    if node is None:
        return SlurmStatus(controller=controller, nodes={}, error=f"{controller} is not among the nodes")
    cmd = ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.key)),
           "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}", shlex.join(SINFO)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                              timeout=40)
    except subprocess.TimeoutExpired:
        return SlurmStatus(controller=controller, nodes={}, error=f"no answer from {controller} within 40s")
    if proc.returncode != 0:
        return SlurmStatus(controller=controller, nodes={},
                           error=f"sinfo on {controller}: " + ssh.ssh_error_line(proc.stderr, proc.returncode))
    return SlurmStatus(controller=controller, nodes=parse_sinfo(proc.stdout))


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    """``sinfo --Node --format=%N|%T|%E`` as {node: state and reason} (a node in several
    partitions is listed once per partition; "none" is Slurm's word for no reason)."""
    out: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        name, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if name and state:
            out[name] = SlurmNode(state=state.strip(), reason="" if reason.strip() == "none" else reason.strip())
    return out
