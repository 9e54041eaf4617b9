"""`gpuprov monitor NAME [--on NODE]`: the monitoring role on a cluster (playbooks/
monitoring.yml): node_exporter on every node, Prometheus and Alertmanager with gpuprov's GPU
alert rules on one node of the cluster, the monitoring host, scraping the others.

The monitoring host is recorded in the cluster's spec (``monitoring_host``) and written into
every inventory gpuprov renders for the cluster afterwards (``monitoring_server: true`` on that
host alone), so that a later `gpuprov monitor NAME`, or the playbook run by hand with the
cluster's inventory, keeps it there. Where Prometheus answers is read back from the host
(its ``/etc/default/prometheus``, which the role writes) and kept with the run; `status` shows
it, with the SSH tunnel that reaches it from here.
"""

from __future__ import annotations

import re
import shlex
import subprocess

from gpuprov import paths
from gpuprov.ansible import runner
from gpuprov.ansible.inventory import render
from gpuprov.ansible.runner import new_run_dir
from gpuprov.cluster import (
    check_reachable,
    cluster_lock,
    expectations,
    load,
    reachable_nodes,
    refresh,
    version_lock,
)
from gpuprov.errors import BadInput
from gpuprov.providers import ClusterFiles
from gpuprov.results.shapes import UNREACHED, HostStats, MonitorResult
from gpuprov.settings import play_secrets, playbook_vars
from gpuprov.ssh import node_key, ssh_options
from gpuprov.state import NodeRecord, Store

KIND = "monitor"
SPEC_KEY = "monitoring_host"
_LISTEN = re.compile(r"--web\.listen-address=(\S+?)\"?(?:\s|$)")


def monitoring_host(spec: dict) -> str | None:
    """The cluster's recorded monitoring host (its inventory marks it), or None."""
    host = spec.get(SPEC_KEY)
    return host if isinstance(host, str) and host else None


def monitor(name: str, *, on: str | None, console, store: Store | None = None) -> MonitorResult:
    store = store or Store()
    cluster = load(store, name)
    with cluster_lock(name):
        provider, files, nodes = refresh(store, cluster)
        names = [n.name for n in nodes]
        host = on or monitoring_host(cluster.spec) or (names[0] if names else "")
        if host not in names:
            raise BadInput(f"--on {host}: not a node of '{name}' (nodes: {', '.join(names) or 'none'})")
        nodes = reachable_nodes(cluster, nodes)
        store.set_spec(name, {**cluster.spec, SPEC_KEY: host})
        lock = version_lock(store, cluster)
        render(cluster.name, cluster.provider, nodes, expectations(provider, nodes, lock), files,
               monitoring_host=host)
        run_dir = new_run_dir(files, KIND)
        run_id = store.start_run(name, KIND, str(run_dir))
        ok, summary = False, dict[str, object]({"host": host})
        try:
            console.say(f"monitor {name}: node_exporter on {len(nodes)} node(s), Prometheus and Alertmanager "
                        f"on {host}")
            reachable, down = check_reachable(files, nodes, console)
            errors = {h: f"unreachable: {why}" for h, why in down.items()}
            played: dict = {}
            if reachable:
                result = runner.run_playbook(paths.playbooks_dir() / "monitoring.yml", files,
                                      [n.name for n in reachable],
                                      run_dir, title=f"monitor {name}", check=False, tags=(),
                                      limit=[n.name for n in reachable] if down else (),
                                      extravars=playbook_vars(cluster, lock), secrets=play_secrets(),
                                      console=console.rich)
                errors |= result.errors
                played = result.hosts
                ok = result.ok and not down
            server = next(n for n in nodes if n.name == host)
            url = prometheus_url(server, files) if ok else None
            out = MonitorResult(
                cluster=name, ok=ok and url is not None, host=host, prometheus=url,
                alertmanager="127.0.0.1:9093 (loopback of the monitoring host)",
                tunnel=tunnel(server, files, url) if url and not provider.nodes_on_this_host else None,
                hosts={n.name: HostStats.of(played[n.name]) if n.name in played else UNREACHED for n in nodes},
                errors=errors)
            if ok and url is None:
                out.errors[host] = "Prometheus's listen address not found in /etc/default/prometheus"
            summary |= {"prometheus": out.prometheus, "tunnel": out.tunnel, "errors": out.errors}
        finally:
            store.finish_run(run_id, ok and summary.get("prometheus") is not None, summary)
    return out


def prometheus_url(node: NodeRecord, files: ClusterFiles) -> str | None:
    """http://ADDRESS:PORT where the host's Prometheus listens, from the file the role wrote
    (read over the cluster's pinned SSH)."""
    proc = subprocess.run(
        ["ssh", "-p", str(node.ssh_port), *ssh_options(files.known_hosts, node_key(node, files.login_key)),
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", f"{node.user}@{node.address}",
         "cat /etc/default/prometheus"],
        capture_output=True, text=True, timeout=60, check=False)
    m = _LISTEN.search(proc.stdout) if proc.returncode == 0 else None
    return f"http://{m.group(1)}" if m else None


def tunnel(node: NodeRecord, files: ClusterFiles, url: str) -> str:
    """An ssh command run here that makes the host's Prometheus answer on localhost:9090, with
    the cluster's pinned known_hosts (remote clusters: Prometheus listens on the node's
    cluster address, which this machine may not reach)."""
    target = url.removeprefix("http://")
    return shlex.join(["ssh", "-N", "-p", str(node.ssh_port),
                       *ssh_options(files.known_hosts, node_key(node, files.login_key)),
                       "-L", f"9090:{target}", f"{node.user}@{node.address}"])
