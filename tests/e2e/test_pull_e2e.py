"""Pull mode end to end through the real CLI: `up --bootstrap pull` on local nodes.

Two nodes boot with gpuprov's agent and their boot configuration; the controller serves the
bundle on the docker bridge's gateway; each node fetches it, checks its sha256, runs site.yml
over a local connection with the bundle's ansible-core, runs the probes on itself, and
reports every task and the probe rows back; `up` shows them as per-node progress and records
them. A third node is bootstrapped by push with the same plays, and the two kinds of node
are compared: same packages, same files under /etc, same probe rows. Then `provision --via
pull` converges the pulled nodes again through their agent. Last, a host that
exists already (static provider, reached at its own address on the bridge) is handed the
agent over SSH and pulls the same way.

The plays: preflight, spot, rdma, microcode (`--tags`). They install real Debian packages
(rdma-core, ibverbs, infiniband-diags, CPU microcode), write modprobe, sysctl, limits and
systemd files, and run every role's lock check; the driver, CUDA and container plays are left
to tests/e2e/test_docker_cluster.py's full-stack node (three more full-stack bootstraps would
prove the same roles again at ten minutes each on this 2-core machine). With these tags the
probes of the plays left out fail, the same ones on every node (compared, not ignored).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess

import pytest

from gpuprov.ansible.inventory import LOCAL_NODE_FREE_GIB
from gpuprov.probes.run import groups_of_plays
from gpuprov.pull.controller import expected_probes
from tests.conftest import run_cli, unbootstrapped_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.extended(why=(
    "pull mode over the controller's own HTTP channel on local nodes: pull and push nodes compared, "
    "provision and patch --via pull, a static host handed the agent (about 10 minutes of two cores); in "
    "`make test` pull mode runs end to end through S3 on emulated EC2 (tests/e2e/test_pull_aws_e2e.py), "
    "and the agent, the bundle and the reports in tests/unit/test_pull*.py"))]

TAGS = "preflight,spot,rdma,microcode"
# Files under /etc that differ between any two nodes whatever bootstraps them (each node's
# name and host key), and the boot mechanism of pull mode itself (its unit stays, disabled by
# its condition: the agent removed its configuration).
PER_NODE = ("/etc/hostname", "/etc/hosts", "/etc/ssh/ssh_host_ed25519_key", "/etc/ssh/ssh_host_ed25519_key.pub")
PULL_BOOT = ("/etc/systemd/system/gpuprov-pull.service",
             "/etc/systemd/system/multi-user.target.wants/gpuprov-pull.service")
ETC_LISTING = r"""find /etc -xdev \( -type f -o -type l \) -print0 | sort -z |
while IFS= read -r -d '' f; do
  if [ -L "$f" ]; then echo "L $f -> $(readlink "$f")";
  else echo "F $f $(stat -c %a:%U:%G "$f") $(sha256sum < "$f" | cut -c1-64)"; fi
done"""


def _up(env: dict[str, str], name: str, count: int, mode: str) -> tuple[dict, str]:
    proc = run_cli("up", "--provider", "docker", "--count", str(count), "--name", name, "--bootstrap", mode,
                   "--tags", TAGS, "-o", "json", env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


@pytest.fixture(scope="module")
def clusters(env: dict[str, str]):
    """(pull cluster: name, JSON, stderr), (push cluster: name, JSON, stderr)."""
    pulled, pushed = f"pull-{secrets.token_hex(3)}", f"push-{secrets.token_hex(3)}"
    try:
        yield (pulled, *_up(env, pulled, 2, "pull")), (pushed, *_up(env, pushed, 1, "push"))
    finally:
        for name in (pulled, pushed):
            run_cli("down", name, "--yes", env=env)


def _node(cluster: str, index: int) -> str:
    return f"gpuprov-{cluster}-node-{index}"


def _in(container: str, script: str) -> str:
    return subprocess.run(["docker", "exec", "-i", container, "bash", "-s"], input=script, capture_output=True,
                          text=True, check=True).stdout


def test_pull_nodes_fetch_check_run_report_and_verify(clusters, env) -> None:
    (name, data, stderr), _ = clusters
    nodes = [f"{name}-node-1", f"{name}-node-2"]
    boot = data["bootstrap"]
    assert boot["ok"] is True and set(boot["hosts"]) == set(nodes)
    for node in nodes:
        stats = boot["hosts"][node]
        assert stats["failed"] == stats["unreachable"] == 0 and stats["changed"] > 0 and stats["tasks"] > 50, stats
        # progress came from the node's own reports, per node and role, as push shows it
        assert f"{node}: rdma" in stderr and f"{node}: changed  microcode : " in stderr
        assert f"{node}: " in stderr and "(probes run on the node)" in stderr
    sha = boot["pull"]["bundle_sha256"]
    assert re.fullmatch(r"[0-9a-f]{64}", sha) and boot["pull"]["bundle_bytes"] > 1_000_000
    assert re.search(rf"pull: bundle {sha[:16]} \([0-9.]+ MB, ansible-core [0-9.]+\) served on "
                     r"http://[0-9.]+:\d+ to this launch's nodes", stderr)
    # the probes ran on each node and were recorded as a verify run, next to the bootstrap's
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    kinds = [r["kind"] for r in status["runs"]]
    assert "bootstrap-pull" in kinds and "verify-quick" in kinds
    # the probes of the plays they ran, every one of them on each node, none failing (before a
    # run of some plays was judged on every probe, and those of the plays it did not run failed)
    counts = boot["pull"]["verify"]
    want = expected_probes(groups=groups_of_plays(TAGS.split(",")))
    assert len(want) > 10 and counts["fail"] == 0 and counts["pass"] > 0, counts
    assert counts["pass"] + counts["skip"] == len(nodes) * len(want), counts
    # A run of some plays (--tags) writes no manifest, as push's does not (a manifest covers
    # the whole site): none recorded, none on the nodes. The manifest a pull of every play
    # writes, and the record of it, are proven part by part in tests/unit/test_pull_manifest.py
    # (a run of every play here would cost two full-stack bootstraps, about 13 minutes).
    assert not status["spec"].get("manifests"), status["spec"].get("manifests")
    for index in (1, 2):
        container = _node(name, index)
        # the node checked the bundle it ran: the manifest it kept is the served bundle's
        kept = json.loads(_in(container, "cat /var/lib/gpuprov/pull/manifest.json"))
        assert kept["tags"] == TAGS.split(",") and kept["format"] == 1
        assert _in(container, "test -e /var/lib/gpuprov/manifest.json && echo present || echo absent").strip() \
            == "absent"
        # its token is gone, the agent ran once and will not again
        assert _in(container, "test -e /etc/gpuprov/pull.json && echo present || echo gone").strip() == "gone"
        state = _in(container, "systemctl show -p Result,ActiveState gpuprov-pull.service")
        assert "Result=success" in state and "ActiveState=active" in state, state


def _etc(container: str) -> dict[str, str]:
    rows = {}
    for line in _in(container, ETC_LISTING).splitlines():
        kind, path, rest = line.split(" ", 2)
        rows[path] = f"{kind} {rest}"
    return rows


def _packages(container: str) -> str:
    return _in(container, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n'")


def _rows(result: dict, node: str) -> list[tuple[str, str, str]]:
    return sorted((r["probe"], r["status"], r["detail"].replace(node, "NODE")) for r in result["hosts"][node])


def test_a_pull_node_and_a_push_node_end_identical(clusters, env) -> None:
    (pulled, _, _), (pushed, _, _) = clusters
    pull_node, push_node = _node(pulled, 1), _node(pushed, 1)
    assert _packages(pull_node) == _packages(push_node)
    pull_etc, push_etc = _etc(pull_node), _etc(push_node)
    differ = sorted(p for p in set(pull_etc) | set(push_etc) if pull_etc.get(p) != push_etc.get(p))
    assert differ == sorted(PER_NODE + PULL_BOOT), differ
    # the same probes, with the same results, whoever runs them: push's verify on both
    one = json.loads(run_cli("verify", pulled, "-o", "json", env=env).stdout)
    two = json.loads(run_cli("verify", pushed, "-o", "json", env=env).stdout)
    assert _rows(one, f"{pulled}-node-1") == _rows(two, f"{pushed}-node-1")
    assert _rows(one, f"{pulled}-node-1") == _rows(one, f"{pulled}-node-2")
    # ... and the rows each pull node reported of itself, recorded with the bootstrap: the probes
    # of the plays it ran (a run of some plays is judged on theirs alone), as `verify --only` has them
    status = json.loads(run_cli("status", pulled, "-o", "json", env=env, check=True).stdout)
    run_dir = next(r["artifact_dir"] for r in status["runs"] if r["kind"] == "bootstrap-pull")
    with open(f"{run_dir}/probes.json") as handle:
        reported = json.load(handle)
    groups = groups_of_plays(TAGS.split(","))
    assert groups == "base or preflight or rdma or microcode"
    theirs = json.loads(run_cli("verify", pulled, "--only", groups, "-o", "json", env=env).stdout)
    for node in (f"{pulled}-node-1", f"{pulled}-node-2"):
        rows = sorted((r["probe"], r["status"], r["detail"].replace(node, "NODE")) for r in reported[node])
        assert rows == _rows(theirs, node)
        assert {p for p, _, _ in rows} < {p for p, _, _ in _rows(one, node)}  # not the driver's, nor cuda's ...
        assert "driver_packages_match_the_lock" not in {p for p, _, _ in rows}


def test_push_after_pull_changes_nothing(clusters, env) -> None:
    """`provision` (push, the mode of every later run) on the pull-bootstrapped nodes: the
    same roles find nothing to do."""
    (pulled, _, _), _ = clusters
    proc = run_cli("provision", pulled, "--tags", TAGS, "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hosts = json.loads(proc.stdout)["hosts"]
    assert {h: (s["changed"], s["failed"]) for h, s in hosts.items()} == dict.fromkeys(hosts, (0, 0)), hosts


def test_provision_via_pull_repairs_a_node_on_the_node_and_leaves_the_other_as_it_is(clusters, env) -> None:
    """`provision NAME --via pull`: the cluster's nodes are handed the agent over SSH and
    converge themselves again with this gpuprov's bundle. One node lost a file the rdma play
    writes: its own run puts it back; the other node's run changes nothing (the plays are
    idempotent through the agent as through push). Refused with nothing changed: --check."""
    (name, _, _), _ = clusters
    first, second = _node(name, 1), _node(name, 2)
    conf = "/etc/nccl.conf"  # the rdma play writes it on every node
    kept = _in(first, f"cat {conf}")
    _in(first, f"rm {conf}")
    refused = run_cli("provision", name, "--via", "pull", "--check", env=env)
    assert refused.returncode == 2 and "--via pull cannot go with --check" in refused.stderr, refused.stderr
    proc = run_cli("provision", name, "--via", "pull", "--tags", TAGS, "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] is True, result
    assert result["hosts"][f"{name}-node-1"]["changed"] > 0, result["hosts"]
    assert result["hosts"][f"{name}-node-2"]["changed"] == 0 and result["hosts"][f"{name}-node-2"]["tasks"] > 50
    assert _in(first, f"cat {conf}") == kept
    assert re.search(r"served on http://[0-9.]+:\d+ to 2 host\(s\)", proc.stderr), proc.stderr
    for node in (first, second):
        assert f"{node.removeprefix('gpuprov-')}: pull agent started over SSH" in proc.stderr
        assert _in(node, "test -e /etc/gpuprov/pull.json && echo present || echo gone").strip() == "gone"
    runs = [r["kind"] for r in json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]]
    assert "provision-pull" in runs, runs


def test_patch_via_pull_rolls_the_plays_on_the_nodes_behind_the_same_gates(clusters, env) -> None:
    """`patch NAME --microcode --via pull`: the roll's plan and its batch run on the nodes
    themselves (patch.yml from this gpuprov's bundle, the plan in check mode, the probes after
    each), the controller publishing a bundle per round and reading the reports. One node lost
    its CPU microcode package (removed by hand): the plan finds it there alone, `--check` moves
    nothing, the roll puts the lock's release back, and the other node is never drained or run."""
    (name, _, _), _ = clusters
    first, second = _node(name, 1), _node(name, 2)
    short = first.removeprefix("gpuprov-")
    # The microcode play installs the package of the host's CPU vendor (the node's /proc/cpuinfo).
    package = _in(first, "grep -q GenuineIntel /proc/cpuinfo && echo intel-microcode || echo amd64-microcode").strip()
    _in(first, f"dpkg -r {package} >/dev/null")
    absent = f"dpkg-query -W -f='${{Status}}' {package} 2>/dev/null | grep -q ' installed' && echo installed || echo absent"

    check = run_cli("patch", name, "--microcode", "--via", "pull", "--check", "-o", "json", env=env, timeout=900)
    assert check.returncode == 0, check.stderr[-3000:]
    planned = json.loads(check.stdout)["hosts"]
    assert any(line.startswith(f"{package} not installed -> ") for line in planned[short]["plan"]), planned
    assert planned[f"{name}-node-2"]["plan"] == [] and planned[f"{name}-node-2"]["status"] == "unchanged", planned
    assert _in(first, absent).strip() == "absent"  # check mode: nothing moved

    proc = run_cli("patch", name, "--microcode", "--via", "pull", "-o", "json", env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] is True and result["batches"] == [[short]], result
    assert result["hosts"][short]["status"] == "patched" and result["hosts"][short]["changed"] > 0, result["hosts"]
    assert any(package in line for line in result["hosts"][short]["moved"]), result["hosts"][short]
    assert result["hosts"][f"{name}-node-2"]["status"] == "unchanged", result["hosts"]
    assert _in(first, absent).strip() == "installed"
    version = f"dpkg-query -W -f='${{Version}}' {package}"
    assert _in(first, version).strip() == _in(second, version).strip() != ""  # the lock's, as the other node's
    # both rounds were pulls: handed over SSH, the plan to both nodes, the batch to the one
    assert "pull agent handed over SSH to 2 node(s)" in proc.stderr or \
        re.search(r"served on http://[0-9.]+:\d+ to 2 host\(s\)", proc.stderr), proc.stderr
    assert re.search(r"served on http://[0-9.]+:\d+ to 1 host\(s\)", proc.stderr), proc.stderr
    runs = [r["kind"] for r in json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["runs"]]
    assert {"patch-check", "patch", "patch-pull-plan", "patch-pull"} <= set(runs), runs
    for node in (first, second):
        assert _in(node, "test -e /etc/gpuprov/pull.json && echo present || echo gone").strip() == "gone"


def test_an_existing_host_is_handed_the_agent_over_ssh_and_pulls(env, tmp_path) -> None:
    """On-prem: the static provider's host is reached at its own address (the bridge, not a
    port forward on this machine's loopback), so the bundle server listens on the address
    on the route to it; the agent and its configuration go over SSH with the pinned key."""
    with unbootstrapped_cluster(env, "prem", count=1) as (machine, nodes):
        container = f"gpuprov-{nodes[0]}"
        address = subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                                  container], capture_output=True, text=True, check=True).stdout.strip()
        cdir = f"{env['GPUPROV_HOME']}/clusters/{machine}"
        with open(f"{cdir}/hostkeys/{nodes[0]}.pub") as handle:
            host_key = " ".join(handle.read().split()[:2])
        hosts = tmp_path / "hosts.yml"
        # The host is a local node on this machine's disk, whatever it has free: it says so with
        # its own floor, as an on-prem host with a small root does (40 GiB is a real node's).
        hosts.write_text(f"user: gpuprov\nkey: {cdir}/id_ed25519\nhosts:\n  - name: rack-1\n"
                         f"    address: {address}\n    port: 22\n    host_key: {host_key}\n"
                         f"    root_free_gib: {LOCAL_NODE_FREE_GIB}\n")
        name = f"onprem-{secrets.token_hex(3)}"
        try:
            proc = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", name, "--bootstrap", "pull",
                           "--tags", TAGS, "-o", "json", env=env, timeout=900)
            assert proc.returncode == 0, proc.stderr[-3000:]
            boot = json.loads(proc.stdout)["bootstrap"]
            assert boot["ok"] is True and boot["hosts"]["rack-1"]["changed"] > 0, boot
            assert boot["pull"]["verify"]["pass"] > 0
            gateway = address.rsplit(".", 1)[0]
            assert re.search(rf"served on http://{re.escape(gateway)}\.\d+:\d+ to 1 host\(s\)", proc.stderr), \
                proc.stderr
            assert "rack-1: pull agent started over SSH" in proc.stderr and "rack-1: rdma" in proc.stderr
            assert _in(container, "test -e /etc/gpuprov/pull.json && echo present || echo gone").strip() == "gone"
        finally:
            run_cli("down", name, "--yes", env=env)
