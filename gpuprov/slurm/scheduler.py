"""A cluster's scheduler (`up --scheduler slurm`, `provision NAME --scheduler slurm`): the
choice as the cluster's record keeps it, its checks, the cluster's munge key and the variables
the slurm play (playbooks/slurm.yml) reads.

The munge key is made here, by gpuprov, never by a node: 1024 random bytes in the cluster's
private directory (0700, beside its SSH key), mode 0600 (gpuprov.slurm.munge). The role copies
it to each node over the pinned SSH connection (no_log); the key's bytes are never a variable,
so they are in no extravars file, run artifact, log or state row. The accounting database's
password (gpuprov.slurm.accounting) is made and kept the same way, and passed as its file's path.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuprov import ssh
from gpuprov.errors import BadInput, GpuprovError
from gpuprov.node_text import printable
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import SlurmNode, SlurmStatus
from gpuprov.slurm import accounting, elastic, munge, topology
from gpuprov.slurm.scheduler_choice import NODE_NAME, Scheduler
from gpuprov.state import ClusterRecord, NodeRecord, Store

MUNGE_KEY = "munge.key"
# The cluster's power key (HMAC of the power program's requests) and where its power service
# says it listens (gpuprov.core.power_service writes it once listening): beside the munge key.
POWER_KEY = "power.key"
POWER_SERVICE = "power-service.json"
# What an AWS cluster's set-up wrote for its controller's service (power_aws_bundle.set_up).
POWER_ON_NODE = "power-aws.json"
# slurm.conf's timeouts for dynamic nodes (docs/slurm.md, "Elastic clusters"): a local node
# from the baked image registers within seconds (5 s measured), so a resume unanswered after
# three minutes has failed; removing a container takes a second, so a suspend gets Slurm's
# default.
RESUME_TIMEOUT_S = 180
SUSPEND_TIMEOUT_S = 30


def of(cluster: ClusterRecord) -> Scheduler:
    """The scheduler a cluster's record says it has (none for a record from before)."""
    return Scheduler.from_options(cluster.spec.get("options") or {})


def record(store: Store, cluster: ClusterRecord, chosen: Scheduler) -> ClusterRecord:
    """``chosen`` written into the cluster's record (after checking its controller and its
    accounting's node are nodes, and that the accounting database stays where it is)."""
    controller_of(cluster, chosen)
    dbd_of(cluster, chosen)
    was = of(cluster)
    if was.kind == "slurm" and was.accounting and chosen.kind == "slurm" and chosen.accounting \
            and dbd_of(cluster, was) != dbd_of(cluster, chosen):
        raise BadInput(f"cluster '{cluster.name}' keeps its accounting database on {dbd_of(cluster, was)}; moving it "
                       "to another node is not built (`gpuprov down NAME --keep-accounting` exports it)")
    options = {k: v for k, v in (cluster.spec.get("options") or {}).items()
               if k not in ("scheduler", "slurm_controller", "slurm_controller_only", "slurm_max_count",
                            "slurm_idle_minutes", "slurm_accounting", "slurm_dbd", "slurm_replace_unhealthy")}
    store.set_spec(cluster.name, {**cluster.spec, "options": {**options, **chosen.checked().as_options()}})
    found = store.get_cluster(cluster.name)
    assert found is not None
    return found


def _asked_node(cluster: ClusterRecord, flag: str, asked: str | None) -> str | None:
    """``asked`` (a node name given with ``flag``), checked to be one of the cluster's nodes."""
    names = [n.name for n in cluster.nodes]
    if asked is not None and asked not in names:
        raise BadInput(f"{flag} {asked}: no node of cluster '{cluster.name}' has that name "
                       f"({', '.join(names) or 'it has none'})")
    if not names:
        raise BadInput(f"cluster '{cluster.name}' has no nodes to run Slurm on")
    return asked


def controller_of(cluster: ClusterRecord, chosen: Scheduler | None = None) -> str:
    """The controller's node name: the one asked for, else the cluster's first node."""
    chosen = chosen or of(cluster)
    return _asked_node(cluster, "--slurm-controller", chosen.controller) or cluster.nodes[0].name


def dbd_of(cluster: ClusterRecord, chosen: Scheduler | None = None) -> str:
    """The node slurmdbd and MariaDB run on: the one asked for (--slurm-dbd), else the controller."""
    chosen = chosen or of(cluster)
    return _asked_node(cluster, "--slurm-dbd", chosen.dbd) or controller_of(cluster, chosen)


def play_vars(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
              say: Any = None, network: dict[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """The slurm play's variables for a run on ``nodes``. slurm.conf lists the play's hosts, so
    Slurm is configured only by a run on every node of the cluster; a run on some of them (new
    nodes of `up`, a replacement) leaves it as it is and says so. ``network``: each node's
    network nodes where its provider knows them (Provider.network_nodes), for topology.conf."""
    chosen = of(cluster)
    if chosen.kind != "slurm":
        return {"gpuprov_scheduler": "none"}
    if {n.name for n in nodes} != {n.name for n in cluster.nodes}:
        if say is not None:
            say(f"  slurm: this run converges {len(nodes)} of the cluster's {len(cluster.nodes)} node(s); "
                f"`gpuprov provision {cluster.name}` adds them to Slurm")
        return {"gpuprov_scheduler": "none"}
    key = munge.ensure_key(files.dir / MUNGE_KEY)
    dynamic = dynamic_vars(cluster, files, chosen)
    return {"gpuprov_scheduler": "slurm", "gpuprov_slurm_controller": controller_of(cluster, chosen),
            "gpuprov_slurm_controller_only": chosen.controller_only, "gpuprov_slurm_munge_key": str(key),
            "gpuprov_slurm_topology": topology_vars(cluster, [d["name"] for d in
                                                             dynamic.get("gpuprov_slurm_dynamic_nodes", [])],
                                                    network or {}),
            **accounting_vars(cluster, files, chosen), **dynamic}


def topology_vars(cluster: ClusterRecord, dynamic: list[str],
                  network: dict[str, tuple[str, ...]]) -> list[dict[str, Any]]:
    """topology.conf's switches (gpuprov.slurm.topology) for the cluster's nodes: by their
    ``network`` nodes where known, else as their records place them (placement group, zone); a
    dynamic node is placed as the node it is made like."""
    places = [topology.Place(n.name, network.get(n.name, ()), str(n.extra.get("placement_group") or ""), n.zone)
              for n in cluster.nodes]
    if dynamic:
        like = next(p for p in places if p.node == template_node(cluster))
        places += [topology.Place(name, like.network_nodes, like.group, like.zone) for name in dynamic]
    return [{"name": sw.name, "nodes": sw.nodes, "switches": sw.switches}
            for sw in topology.switches(cluster.name, places)]


def accounting_vars(cluster: ClusterRecord, files: ClusterFiles, chosen: Scheduler) -> dict[str, Any]:
    """The slurm play's accounting: on (slurmdbd and MariaDB on the controller, or the node of
    --slurm-dbd), with the path of the cluster's database password file (made once, like the
    munge key), unless the cluster was recorded with --no-accounting."""
    if not chosen.accounting:
        return {"gpuprov_slurm_accounting": False}
    password = accounting.ensure_password(files.dir / accounting.PASSWORD_FILE)
    return {"gpuprov_slurm_accounting": True, "gpuprov_slurm_accounting_password": str(password),
            "gpuprov_slurm_dbd_host": dbd_of(cluster, chosen)}


def template_node(cluster: ClusterRecord, chosen: Scheduler | None = None) -> str:
    """The compute node dynamic nodes are made like (their resources in slurm.conf, their image
    baked from it): a compute node that is not the controller where there is one."""
    chosen = chosen or of(cluster)
    controller = controller_of(cluster, chosen)
    others = [n.name for n in cluster.nodes if n.name != controller]
    if others:
        return others[0]
    if chosen.controller_only:
        raise BadInput(f"cluster '{cluster.name}' has no compute node to make dynamic nodes like")
    return controller


def power_url(files: ClusterFiles) -> str | None:
    """The URL the cluster's power service listens on, as it last said (None: never started)."""
    try:
        raw = json.loads((files.dir / POWER_SERVICE).read_text())
    except (OSError, ValueError):
        return None
    url = raw.get("url") if isinstance(raw, dict) else None
    return url if isinstance(url, str) else None


def dynamic_vars(cluster: ClusterRecord, files: ClusterFiles, chosen: Scheduler) -> dict[str, Any]:
    """The slurm play's dynamic nodes, power settings and power service for a cluster with
    ``--max-count`` (none without): each dynamic node like the template node, powered down
    after the idle time, its programs gpuprov's, asking the service the cluster's file names."""
    if chosen.max_count is None:
        return {}
    count = chosen.max_count - len(cluster.nodes)
    # On aws the service runs on the controller (power_aws_bundle.set_up wrote what it is given).
    on_node = power_on_node(files)
    url = on_node.get("url") if on_node else power_url(files)
    if count <= 0 or not isinstance(url, str):
        return {}
    like = template_node(cluster, chosen)
    idle = chosen.idle_minutes or elastic.DEFAULT_IDLE_MINUTES
    service = {"url": url, "key_src": str(munge.ensure_key(files.dir / POWER_KEY))}
    if on_node.get("aws"):
        service["aws"] = on_node["aws"]
    return {"gpuprov_slurm_dynamic_nodes": [{"name": n, "like": like}
                                            for n in elastic.dynamic_names(cluster.name, count)],
            "gpuprov_slurm_power": {"suspend_time": idle * 60, "suspend_timeout": SUSPEND_TIMEOUT_S,
                                    "resume_timeout": int(on_node.get("resume_timeout") or RESUME_TIMEOUT_S)},
            "gpuprov_slurm_power_service": service}



def power_on_node_image(files: ClusterFiles) -> str:
    """The image the controller's service launches dynamic nodes from, as the set-up wrote it ("")."""
    config = (power_on_node(files).get("aws") or {}).get("config") or {}
    return str(config.get("image") or "")


def power_on_node(files: ClusterFiles) -> dict[str, Any]:
    """What the slurm play hands a power service on the controller (aws), as the cluster's
    set-up last wrote it ({} where it has none)."""
    try:
        raw = json.loads((files.dir / POWER_ON_NODE).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


# What `status` asks the controller: each node's state and reason, one line each (a fixed
# command, quoted for the node's shell: nothing of the user's reaches it).
SINFO = ("sinfo", "--noheader", "--Node", "--format=%N|%T|%E")


def _controller_command(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
                        argv: tuple[str, ...], of_node: Any = None) -> tuple[str, list[str] | str]:
    """(controller, the ssh command running ``argv`` on it over its pinned connection), or
    (controller, why there is none); ``of_node``: another Slurm node than the controller (a
    function of the cluster and its choice: dbd_of)."""
    chosen = of(cluster)
    try:
        controller = (of_node or controller_of)(cluster, chosen)
    except BadInput as exc:
        return chosen.controller or "", str(exc)
    node = next((n for n in nodes if n.name == controller), None)
    if node is None:
        return controller, f"{controller} is not among the nodes"
    options = ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.login_key))
    return controller, ["ssh", "-p", str(node.ssh_port), *options, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                        "--", f"{node.user}@{node.address}", shlex.join(argv)]


def _on_controller(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
                   argv: tuple[str, ...]) -> tuple[str, str | None, str]:
    """Run ``argv`` on the controller: (controller, its stdout or None, why not)."""
    controller, cmd = _controller_command(cluster, files, nodes, argv)
    if isinstance(cmd, str):
        return controller, None, cmd
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                              timeout=40)
    except subprocess.TimeoutExpired:
        return controller, None, f"no answer from {controller} within 40s"
    if proc.returncode != 0:
        program = argv[2] if argv[0] == "sudo" else argv[0]
        return controller, None, f"{program} on {controller}: " + ssh.ssh_error_line(proc.stderr, proc.returncode)
    return controller, proc.stdout, ""


# The power service where it runs on the controller (aws; roles/slurm/tasks/power_aws.yml).
POWER_UNIT = "gpuprov-power-aws.service"
POWER_LINES = 5


def controller_service(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord]) -> tuple[bool, list[str]]:
    """Whether the power service runs on the controller (`systemctl is-active`), and the last
    lines of its journal there, each made printable and cut to 300 characters (fixed words over
    the controller's pinned SSH; (False, []) where the controller does not answer)."""
    _, state, _ = _on_controller(cluster, files, nodes, ("systemctl", "is-active", POWER_UNIT))
    _, journal, _ = _on_controller(cluster, files, nodes, (
        "sudo", "-n", "journalctl", "--unit", POWER_UNIT, "--lines", str(POWER_LINES), "--no-pager", "--quiet",
        "--output", "cat"))
    lines = [printable(line)[:300] for line in (journal or "").splitlines() if line.strip()]
    return (state or "").strip() == "active", lines[-POWER_LINES:]


def on_controller(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
                  argv: tuple[str, ...]) -> tuple[str, str | None, str]:
    """Fixed words ``argv`` run on the Slurm controller over its pinned SSH connection:
    (controller, its stdout or None, why not: one line)."""
    return _on_controller(cluster, files, nodes, argv)


def controller_command(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
                       argv: tuple[str, ...]) -> tuple[str, list[str] | str]:
    """(controller, the ssh command running fixed words ``argv`` on it over its pinned
    connection), or (controller, why there is none): for a command whose output is streamed
    to a file (gpuprov.core.slurm_accounts' export)."""
    return _controller_command(cluster, files, nodes, argv)


def dbd_command(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord],
                argv: tuple[str, ...]) -> tuple[str, list[str] | str]:
    """As controller_command, on the node the accounting database runs on (dbd_of)."""
    return _controller_command(cluster, files, nodes, argv, of_node=dbd_of)


def slurm_status(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord]) -> SlurmStatus | None:
    """Each node's Slurm state and reason, asked of the controller over its pinned SSH
    connection (None where the cluster runs no Slurm; ``error`` where the controller did not
    answer)."""
    if of(cluster).kind != "slurm":
        return None
    controller, out, why = _on_controller(cluster, files, nodes, SINFO)
    if out is None:
        return SlurmStatus(controller=controller, nodes={}, error=why)
    return SlurmStatus(controller=controller, nodes=parse_sinfo(out))


# A reason as slurmctld keeps it: one line of these characters (what gpuprov writes; a node's or
# an error's words are made to fit, never passed as they are).
_REASON_CHARS = re.compile(r"[^A-Za-z0-9 _.,:;()/+=@'-]")
MAX_REASON = 200


def reason_text(text: str) -> str:
    return _REASON_CHARS.sub("?", printable(" ".join(text.split())))[:MAX_REASON]


def mark_down(cluster: ClusterRecord, files: ClusterFiles, names: list[str], reason: str) -> str:
    """Set Slurm nodes ``names`` (names gpuprov checked) DOWN with ``reason`` on the
    controller (`scontrol update`, as root, over its pinned SSH): Slurm requeues their jobs.
    "" once done, else why not (one line)."""
    hostlist = ",".join(names)
    if not names or not all(NODE_NAME.fullmatch(n) for n in names):
        return f"not node names: {hostlist[:80]!r}"
    argv = ("sudo", "-n", "scontrol", "update", f"NodeName={hostlist}", "State=DOWN",
            f"Reason=gpuprov: {reason_text(reason)}")
    return _on_controller(cluster, files, list(cluster.nodes), argv)[2]


def resume_nodes(cluster: ClusterRecord, files: ClusterFiles, names: list[str]) -> str:
    """Lift the drain of Slurm nodes ``names`` (names gpuprov checked): `scontrol update
    State=RESUME` on the controller. "" once done, else why not (one line)."""
    hostlist = ",".join(names)
    if not names or not all(NODE_NAME.fullmatch(n) for n in names):
        return f"not node names: {hostlist[:80]!r}"
    return _on_controller(cluster, files, list(cluster.nodes),
                          ("sudo", "-n", "scontrol", "update", f"NodeName={hostlist}", "State=RESUME"))[2]


# A partition's name as gpuprov's slurm play writes it (roles/slurm: the instance type's, or
# "gpu"): what a partition name read back from the controller must be to become an argument.
PARTITION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def partitions_of(cluster: ClusterRecord, files: ClusterFiles, names: list[str]) -> tuple[list[str], str]:
    """The partitions Slurm nodes ``names`` belong to, as the controller says: (names, why not)."""
    hostlist = ",".join(names)
    if not names or not all(NODE_NAME.fullmatch(n) for n in names):
        return [], f"not node names: {hostlist[:80]!r}"
    _, out, why = _on_controller(cluster, files, list(cluster.nodes),
                                 ("sinfo", "--noheader", "--Node", f"--nodes={hostlist}", "--format=%R"))
    if out is None:
        return [], why
    found = sorted({w for w in printable(out, lines=True).split() if PARTITION_NAME.fullmatch(w)})
    return found, "" if found else f"no partition of {hostlist[:80]} on the controller"


def set_partitions(cluster: ClusterRecord, files: ClusterFiles, partitions: list[str], state: str) -> str:
    """Set ``partitions`` (names gpuprov checked) to ``state`` (UP or INACTIVE: an INACTIVE
    partition takes jobs and schedules none, ParallelCluster's "protected mode"): "" once done."""
    if state not in ("UP", "INACTIVE"):
        raise ValueError(state)
    if not partitions or not all(PARTITION_NAME.fullmatch(p) for p in partitions):
        return f"not partition names: {','.join(partitions)[:80]!r}"
    for name in partitions:
        why = _on_controller(cluster, files, list(cluster.nodes), ("sudo", "-n", "scontrol", "update",
                                                                   f"PartitionName={name}", f"State={state}"))[2]
        if why:
            return why
    return ""


def power_down_force(cluster: ClusterRecord, files: ClusterFiles, names: list[str]) -> str:
    """Power dynamic nodes ``names`` down now and return them to service powered down (`scontrol
    update State=POWER_DOWN_FORCE`: their jobs requeued, the suspend program run, idle~ once
    SuspendTimeout has passed, ready to be resumed for a job): a node DOWN from a failed resume
    (`State=RESUME` would power it up with no job for it, seen on 22.05) or drained by its own
    health. "" once done."""
    hostlist = ",".join(names)
    if not names or not all(NODE_NAME.fullmatch(n) for n in names):
        return f"not node names: {hostlist[:80]!r}"
    return _on_controller(cluster, files, list(cluster.nodes),
                          ("sudo", "-n", "scontrol", "update", f"NodeName={hostlist}", "State=POWER_DOWN_FORCE"))[2]


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    """``sinfo --Node --format=%N|%T|%E`` as {node: state and reason} (a node in several
    partitions is listed once per partition; "none" is Slurm's word for no reason)."""
    out: dict[str, SlurmNode] = {}
    for line in printable(text, lines=True).splitlines():
        name, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if name and state:
            out[name] = SlurmNode(state=state.strip(), reason="" if reason.strip() == "none" else reason.strip())
    return out


# -- a node whose slurmd serves another cluster is never clobbered ----------------------------
# Before a run that would configure Slurm, each node is asked for its slurm.conf (a fixed
# command, quoted for the node's shell: nothing of the user's reaches it); exit 3: no file.
SLURM_CONF = "/etc/slurm/slurm.conf"
_NO_CONF = 3
# How long a node whose SSH does not answer yet (refused, reset: a node just started) is asked
# again before it is left to the run.
READ_WAIT_S = 20.0
READ_CONF = ("sh", "-c", f"[ -e {SLURM_CONF} ] || exit {_NO_CONF}; exec cat {SLURM_CONF}")
# Slurm's parser (parse_config.c): Key=Value pairs, the key in any case, spaces around '='
# allowed, a value quoted or up to the next space; '#' starts a comment unless escaped ('\\#').
_CLUSTER_NAME = re.compile(r'(?:^|\s)ClusterName\s*=\s*(?:"([^"]*)"|(\S+))', re.IGNORECASE)
_COMMENT = re.compile(r"(?<!\\)#.*")


def slurm_cluster_name(cluster_name: str) -> str:
    """The ClusterName the slurm play writes for a gpuprov cluster (playbooks/slurm.yml: the
    name lower-cased, every character but a-z 0-9 '_' '-' made '-')."""
    return re.sub(r"[^a-z0-9_-]", "-", cluster_name.lower())


def conf_cluster_name(text: str) -> str | None:
    """The ClusterName a slurm.conf names, lower-cased as Slurm takes it (the last one where it
    is given twice); None for a file that names none."""
    found = None
    for line in text.splitlines():
        for match in _CLUSTER_NAME.finditer(_COMMENT.sub("", line)):
            found = match.group(1) if match.group(1) is not None else match.group(2)
    if found is None:
        return None
    # Shown in a one-line message: nothing of the file's may move the terminal or add a line.
    return printable(found.strip().lower())[:64]


def _read_conf(node: NodeRecord, files: ClusterFiles) -> tuple[str, str | None]:
    """("file", its text) / ("none", None) / ("unreached", why) / ("unread", why). A node whose
    SSH does not answer yet (a node just started) is asked again for up to READ_WAIT_S seconds:
    one skipped here but reached by the run a moment later would be clobbered."""
    cmd = ["ssh", "-p", str(node.ssh_port), *ssh.ssh_options(files.known_hosts, ssh.node_key(node, files.login_key)),
           "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}",
           shlex.join(READ_CONF)]
    deadline = time.monotonic() + READ_WAIT_S
    while True:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                                  timeout=40, errors="replace")
        except subprocess.TimeoutExpired:
            return "unreached", "no answer within 40s"
        if proc.returncode == 0:
            return "file", proc.stdout
        if proc.returncode == _NO_CONF:
            return "none", None
        why = ssh.ssh_error_line(proc.stderr, proc.returncode)
        if proc.returncode != 255:
            return "unread", why
        if ssh.HOST_KEY_MISMATCH in why or "Permission denied" in proc.stderr or time.monotonic() > deadline:
            return "unreached", why
        time.sleep(1.0)


def would_configure(cluster: ClusterRecord, nodes: list[NodeRecord], chosen: Scheduler | None = None,
                    tags: list[str] | None = None) -> bool:
    """Whether a run on ``nodes`` (with ``tags``) configures Slurm: the cluster has it (or is
    being given it), the slurm play is among the tags, and the run reaches every node
    (play_vars)."""
    return ((chosen or of(cluster)).kind == "slurm" and (not tags or "slurm" in tags)
            and {n.name for n in nodes} == {n.name for n in cluster.nodes})


def refuse_foreign(cluster: ClusterRecord, files: ClusterFiles, nodes: list[NodeRecord]) -> None:
    """BadInput (one line) where a node's slurm.conf names another ClusterName than the one
    the slurm play would write (or names none): that node's slurmd serves another cluster and
    is never clobbered. A node without the file, or with this cluster's name, passes; a node
    whose SSH does not answer within the wait is left to the run (which finds it unreachable
    too, reports it and leaves it out); one whose file cannot be read is refused (exit 1)."""
    ours = slurm_cluster_name(cluster.name)
    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), 32))) as pool:
        answers = list(pool.map(lambda n: _read_conf(n, files), nodes))
    foreign, unread = [], []
    for node, (kind, text) in zip(nodes, answers, strict=True):
        if kind == "file":
            theirs = conf_cluster_name(text or "")
            foreign += [] if theirs == ours else [
                f"{node.name}: its {SLURM_CONF} " + (f"serves Slurm cluster '{theirs}'" if theirs is not None
                                                     else "names no ClusterName")]
        elif kind == "unread":
            unread.append(f"{node.name}: {SLURM_CONF} could not be read ({text})")
    if foreign:
        raise BadInput(f"{'; '.join(foreign)}, not this cluster's '{ours}': refused, "
                       "nothing recorded or changed")
    if unread:
        raise GpuprovError("; ".join(unread) + ": refused, nothing recorded or changed")
