"""End to end through the real CLI, on a cluster grown from the suite's one node from scratch.

tests/e2e/test_docker_cluster.py bootstraps that node (the whole site, the real DKMS build),
verifies it and bakes it into an image for its lock; tests/e2e/scratch_image.py hands the image
here. This unit grows a cluster from it the way a fleet grows: `up` boots node 1 from the image
baked for the lock and converges the whole site there with nothing to change, `up --count 2` adds
node 2 the same way while node 1, whose manifest holds, runs no play. On these two nodes: the
probes (exactly the passes of the node from scratch), the manifests and drift of issue 34
(tests/e2e/drift.py says what and why), check mode, a colleague's plain shell, status, the static
provider over the same machines, a roll onto the image, and down. Run alone, it makes the node
from scratch and its image itself.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.drift import (
    DRIFT,
    GUARD,
    MANIFEST,
    PIN,
    WORDS,
    ansible_hosts,
    assert_manifests,
    assert_verified,
    last_run,
    provision,
)
from tests.e2e.nodes import cleanup_labels, cluster_dir, labelled, node_sh
from tests.e2e.scratch_image import SCRATCH_UNIT, in_session, made_alone, remove_image, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def scratch(env: dict[str, str], request: pytest.FixtureRequest):
    """The from-scratch unit's image (waited for), or one made here when that unit is not in the
    session; removed at the end (this unit is its last user)."""
    record = wait_for() if in_session(request.session, SCRATCH_UNIT) else made_alone(env)
    try:
        yield record
    finally:
        remove_image(record)


@pytest.fixture(scope="module")
def benv(env: dict[str, str], scratch) -> dict[str, str]:
    """This module's environment, baking into (and booting from) the from-scratch unit's repository."""
    return {**env, "GPUPROV_BAKED_REPO": scratch["repo"]}


@pytest.fixture(scope="module")
def grown(benv: dict[str, str], scratch):
    """Node 1 from the baked image, then node 2: (name, first up, second up), each as (JSON,
    stderr). Everything is removed afterwards."""
    name = f"grw-{secrets.token_hex(3)}"
    try:
        first = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "-o", "json",
                        env=benv, timeout=1200)
        assert first.returncode == 0, first.stderr[-3000:]
        second = run_cli("up", "--provider", "docker", "--count", "2", "--name", name, "-o", "json",
                         env=benv, timeout=1200)
        assert second.returncode == 0, second.stderr[-3000:]
        yield name, (json.loads(first.stdout), first.stderr), (json.loads(second.stdout), second.stderr)
    finally:
        run_cli("down", name, "--yes", env=benv)
        cleanup_labels(name)


@pytest.fixture(scope="module")
def cluster(grown):
    """The two-node cluster: (name, the `up` that made it two nodes, its stderr)."""
    name, _, (data, stderr) = grown
    return name, data, stderr


@pytest.fixture(scope="module")
def baked(scratch):
    """The image baked from the node from scratch: (its ref and lock hash, '')."""
    return {"ref": scratch["ref"], "lock_hash": scratch["lock_hash"]}, ""


def test_nodes_from_the_baked_image_have_nothing_to_change(grown, scratch, benv) -> None:
    """Issue 15: `up` picks the image baked for the cluster's lock and says so; node 1 boots
    from it and the whole site converges there with changed 0 (every stack role: the image
    carries exactly the lock); `up --count 2` adds node 2 the same way; health passes; status
    shows which node came from which image. Issue 34: the grown cluster converges in the size of
    the change: node 1, whose manifest holds, runs no play."""
    name, (one, one_err), (data, stderr) = grown
    first, second = f"{name}-node-1", f"{name}-node-2"
    image = {"ref": scratch["ref"], "baked_for": scratch["lock_hash"]}
    for made, err in ((one, one_err), (data, stderr)):
        assert made["image"] == {**image, "reason": made["image"]["reason"]}
        assert f"image: {scratch['ref']} (baked for lock {scratch['lock_hash']}" in err
        assert made["health"]["ok"] is True
    assert (one["bootstrap"]["hosts"][first]["changed"], one["bootstrap"]["hosts"][first]["failed"]) == (0, 0)
    assert one["bootstrap"]["hosts"][first]["tasks"] > 50  # the whole site ran, not a subset
    assert [n["name"] for n in data["nodes"]] == [first, second]
    hosts, manifest = data["bootstrap"]["hosts"], data["bootstrap"]["manifest"]
    assert set(hosts) == {first, second}
    assert (hosts[second]["changed"], hosts[second]["failed"]) == (0, 0), hosts
    assert hosts[second]["tasks"] > 50, hosts
    assert (manifest[second]["state"], manifest[second]["action"]) == ("no manifest recorded", "full run")
    assert (manifest[first]["state"], manifest[first]["action"]) == ("held", "unchanged"), manifest
    assert hosts[first] == {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "tasks": 0}
    assert f"{first}: unchanged (manifest held, {manifest[first]['items']} items checked)" in stderr
    assert f"{second}: gpuprov_base" in stderr or f"{second}: gpu_preflight" in stderr
    status = json.loads(run_cli("status", name, "-o", "json", env=benv, check=True).stdout)
    booted = {i["node"]: (i["image"], i["matches_lock"]) for i in status["images"]}
    assert booted == dict.fromkeys([first, second], (scratch["ref"], True)), booted


def test_host_keys_are_pinned_before_first_contact(cluster, benv) -> None:
    name, data, _ = cluster
    cdir = cluster_dir(benv, name)
    known = (cdir / "known_hosts").read_text()
    for node in data["nodes"]:
        pinned = (cdir / "hostkeys" / f"{node['name']}.pub").read_text().split()[1]
        assert f"[127.0.0.1]:{node['ssh_port']} ssh-ed25519 {pinned}" in known
    inventory = (cdir / "inventory.yml").read_text()
    assert "StrictHostKeyChecking=yes" in inventory and "StrictHostKeyChecking=no" not in inventory
    assert (cdir / "id_ed25519").stat().st_mode & 0o777 == 0o600


def test_verify_passes_exactly_what_the_node_from_scratch_passes(grown, benv, scratch) -> None:
    """Issue 53: each `up` ran the probes before it called the cluster ready. The first made the
    cluster verified; the second added a node that was never probed (converged from the image
    with nothing to change), so the cluster was probed again, both nodes, before it was ready."""
    name, (one, one_err), (data, stderr) = grown
    assert one["verdict"]["ready"] is True and set(one["verify"]["hosts"]) == {f"{name}-node-1"}, one_err[-2000:]
    assert data["verdict"] == {"ready": True, "next": f"gpuprov ssh {name}",
                               "why": f"2 node(s) verified ({data['verify']['summary']['pass']} probes passed)"}
    assert stderr.rstrip().splitlines()[-1] == f"{name}: ready: {data['verdict']['why']}; next: `gpuprov ssh {name}`"
    result = data["verify"]
    assert_verified(result, {n["name"] for n in data["nodes"]})
    # each node booted from the baked image passes exactly what the node from scratch passed
    passed = [sorted(p["probe"] for p in probes if p["status"] == "pass") for probes in result["hosts"].values()]
    assert passed == [scratch["passed"]] * 2, passed


def test_a_converged_node_holds_its_manifest_root_only(cluster, benv) -> None:
    """Issue 34: each node from the baked image holds the manifest of its whole-site run."""
    name, data, _ = cluster
    assert_manifests(benv, name, [n["name"] for n in data["nodes"]])


def test_a_no_op_runs_no_ansible_where_the_manifest_holds(cluster, benv) -> None:
    name, cluster_data, _ = cluster
    data, stderr = provision(name, benv)
    assert data["ok"] is True
    for node in (n["name"] for n in cluster_data["nodes"]):
        assert data["manifest"][node]["action"] == "unchanged" and data["manifest"][node]["drift"] == [], stderr
        assert data["hosts"][node] == {"ok": 0, "changed": 0, "failed": 0, "unreachable": 0, "tasks": 0}
        assert f"{node}: unchanged (manifest held, {data['manifest'][node]['items']} items checked)" in stderr
    run = last_run(name, benv)
    assert (run["kind"], run["ok"]) == ("provision", True) and ansible_hosts(run) == set()


def test_check_mode_on_converged_nodes_reports_nothing_to_change(cluster, benv) -> None:
    """Ansible's check mode over the whole site: `--full` runs every node, manifests held or
    not (without it the nodes would run no play at all: the test above)."""
    name, _, _ = cluster
    proc = run_cli("provision", name, "--check", "--full", "-o", "json", env=benv)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert "manifest" not in result
    assert all(s["changed"] == 0 and s["failed"] == 0 and s["tasks"] > 50 for s in result["hosts"].values()), result


# What the check of the drifted node counted, for the real run that follows to agree with.
PLANNED: dict[str, int] = {}


def test_check_plans_each_drift_item_by_item_and_changes_nothing(cluster, benv) -> None:
    name, data, _ = cluster
    first, second = (n["name"] for n in data["nodes"])
    smi = node_sh(first, "dpkg-query -W -f '${Version}' nvidia-smi")
    for command in DRIFT:
        node_sh(first, command)
    data, stderr = provision(name, benv, "--check", code=3)  # 3: changes pending
    assert data["manifest"][first]["state"] == "drifted" and data["manifest"][first]["action"] == "full run"
    # Issue 53: the plan counts and names each task that would change, the commands check mode
    # skips included (the package unheld by hand is held again by `apt-mark hold`); the real
    # run that follows changes exactly as many (the next test).
    planned = data["would_change"][first]
    assert "Hold NVIDIA packages (they move only with the lock)" in planned, planned
    assert data["hosts"][first]["changed"] == len(planned) > 0
    assert second not in data["would_change"]
    PLANNED[first] = len(planned)
    assert sorted(data["manifest"][first]["drift"]) == sorted(w.format(smi) for w in WORDS)
    assert data["manifest"][second]["action"] == "unchanged"
    assert data["hosts"][second]["tasks"] == 0 < data["hosts"][first]["tasks"]
    assert f"{first}: full run (drifted: " in stderr
    # Nothing changed: the node is as the drift left it.
    assert "# by hand" in node_sh(first, f"cat {PIN}")
    assert "nvidia-driver" not in node_sh(first, "apt-mark showhold").split()
    assert node_sh(first, "systemctl is-active docker").strip() == "inactive"


def test_the_next_provision_fixes_the_drifted_node_alone(cluster, benv) -> None:
    name, data, _ = cluster
    first, second = (n["name"] for n in data["nodes"])
    data, _ = provision(name, benv)
    assert data["ok"] is True
    assert data["manifest"][first]["action"] == "full run" and data["hosts"][first]["changed"] > 0
    # as many changes as the plan counted (issue 53: a plan never says fewer than the run does)
    assert data["hosts"][first]["changed"] == PLANNED.get(first, data["hosts"][first]["changed"]), PLANNED
    assert data["manifest"][second]["action"] == "unchanged" and data["hosts"][second]["tasks"] == 0
    assert ansible_hosts(last_run(name, benv)) == {first}
    assert "# by hand" not in node_sh(first, f"cat {PIN}")
    assert node_sh(first, f"test -f {GUARD} && echo yes").strip() == "yes"
    assert {"nvidia-driver", "nvidia-smi"} <= set(node_sh(first, "apt-mark showhold").split())
    assert node_sh(first, "systemctl is-active docker").strip() == "active"
    assert node_sh(first, "systemctl is-enabled nvidia-persistenced").strip() == "enabled"
    assert node_sh(first, "dpkg --audit; echo audited").strip() == "audited"
    # And the repaired node holds again.
    again, _ = provision(name, benv)
    assert {n: m["action"] for n, m in again["manifest"].items()} == {first: "unchanged", second: "unchanged"}


def test_verify_catches_drift_and_a_plain_shell_repairs_only_it(cluster, benv, tmp_path) -> None:
    """Someone removes a guard on node 1: `verify` fails exactly that probe there. A re-run
    from a plain shell (a colleague's: no GPUPROV_* variable, a settings file that names other
    sources) converges the nodes against the sources the cluster was built with: it puts the
    guard back and changes nothing else (one change on node 1, none on node 2; a source taken
    from that shell would change both nodes' configuration), and `verify` passes. Node 2's
    manifest is gone meanwhile (issue 34): a node without one gets the whole site, which writes
    it again, so node 2's run is that shell's proof too. (One re-run for the three proofs: a
    whole-site converge of two nodes is a minute and more on two cores.)"""
    name, _, _ = cluster
    broken = f"{name}-node-1"
    node_sh(f"{name}-node-2", f"rm {MANIFEST}")
    # Someone removes the guard that keeps unattended-upgrades off the GPU packages.
    cid = subprocess.run(["docker", "ps", "-q", "--filter", f"label=gpuprov.node={broken}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["docker", "exec", cid, "rm", "/etc/apt/apt.conf.d/51gpuprov-unattended-upgrades"],
                   check=True)
    proc = run_cli("verify", name, "-o", "json", env=benv)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    failed = [(h, p["probe"]) for h, ps in result["hosts"].items() for p in ps if p["status"] == "fail"]
    assert failed == [(broken, "unattended_upgrades_leave_gpu_packages")]
    detail = next(p["detail"] for p in result["hosts"][broken] if p["status"] == "fail")
    # the other roles' drop-ins still guard their own packages (NCCL's is the cuda role's
    # since it installs NCCL); cuDNN's was only in this one
    assert "libcudnn8" in detail, detail

    other = tmp_path / "settings.toml"
    other.write_text('artifact_mirror = "http://127.0.0.1:9/"\nregistry_mirror = "http://127.0.0.1:9"\n')
    plain = {k: v for k, v in benv.items() if not k.startswith("GPUPROV_")}
    plain |= {"GPUPROV_HOME": benv["GPUPROV_HOME"], "GPUPROV_CONFIG": str(other)}
    proc = run_cli("provision", name, "-o", "json", env=plain)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["ok"] is True
    assert {h: s["changed"] for h, s in result["hosts"].items()} == {broken: 1, f"{name}-node-2": 0}, result
    assert result["manifest"][f"{name}-node-2"]["state"] == "manifest missing"
    assert result["hosts"][f"{name}-node-2"]["tasks"] > 50  # the whole site, not a subset
    assert node_sh(f"{name}-node-2", f"test -f {MANIFEST} && echo yes").strip() == "yes"  # written again
    assert ansible_hosts(last_run(name, plain)) == {broken, f"{name}-node-2"}
    assert run_cli("verify", name, env=benv).returncode == 0
    recorded = json.loads(run_cli("status", name, "-o", "json", env=plain, check=True).stdout)["settings"]
    assert recorded["artifact_mirror"]["value"] == benv["GPUPROV_ARTIFACT_MIRROR"]
    # A shell that names another source on purpose is told how to change the cluster.
    moved = run_cli("provision", name, env={**benv, "GPUPROV_ARTIFACT_MIRROR": "http://127.0.0.1:9/"})
    assert moved.returncode == 2 and f"gpuprov settings {name} --set artifact_mirror=" in moved.stderr


def test_status_list_and_inventory(cluster, benv) -> None:
    name, _, _ = cluster
    assert run_cli("verify", name, env=benv).returncode == 0
    status = json.loads(run_cli("status", name, "-o", "json", env=benv, check=True).stdout)
    assert status["state"] == "verified" and status["failed_step"] is None and len(status["nodes"]) == 2
    assert {r["kind"] for r in status["runs"]} >= {"provision", "verify-quick"}
    for run in status["runs"]:
        assert Path(run["artifact_dir"]).is_dir()
    listed = json.loads(run_cli("list", "-o", "json", env=benv, check=True).stdout)
    assert {"name": name, "provider": "docker", "nodes": 2, "state": "verified"}.items() <= next(
        c for c in listed if c["name"] == name).items()
    inv = json.loads(run_cli("inventory", name, "-o", "json", env=benv, check=True).stdout)
    assert sorted(inv["gpuprov_nodes"]["hosts"]) == [f"{name}-node-1", f"{name}-node-2"]
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, env=benv)
    assert proc.returncode == 2 and "does not shrink" in proc.stderr


def test_static_provider_manages_existing_hosts_and_never_touches_them(cluster, benv, tmp_path) -> None:
    name, data, _ = cluster
    cdir = cluster_dir(benv, name)
    hosts = tmp_path / "hosts.yml"
    lines = [f"known_hosts: {cdir / 'known_hosts'}", "user: gpuprov", f"key: {cdir / 'id_ed25519'}",
             "hosts:"]
    for i, node in enumerate(data["nodes"], 1):
        lines += [f"  - name: rack-{i}", "    address: 127.0.0.1", f"    port: {node['ssh_port']}",
                  "    instance_type: docker-node"]
    hosts.write_text("\n".join(lines) + "\n")
    static = f"st-{name}"
    # The same machines under the same lock (docker-node from Debian): the probes expect
    # exactly what the docker cluster installed, down to the site image's lock tag.
    up = run_cli("up", "--provider", "static", "--hosts", str(hosts), "--name", static,
                 "--type", "docker-node", "--source", "distro", "--no-bootstrap", "-o", "json",
                 env=benv)
    assert up.returncode == 0, up.stderr
    assert [n["name"] for n in json.loads(up.stdout)["nodes"]] == ["rack-1", "rack-2"]
    # --no-bootstrap means no playbooks, not no trust: each host answered with its pinned key.
    status = json.loads(run_cli("status", static, "-o", "json", env=benv, check=True).stdout)
    assert status["state"] == "reachable"
    assert {n["state"] for n in status["nodes"]} == {"reachable"}
    pinned = (cluster_dir(benv, static) / "known_hosts").read_text()
    assert pinned.count("ssh-ed25519") == 2
    # A host that presents another key than the one declared is refused, and nothing is kept.
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    wrong_key = " ".join(impostor.with_suffix(".pub").read_text().split()[:2])
    wrong = tmp_path / "wrong.yml"
    wrong.write_text("\n".join([*lines[:4], "  - name: rack-1", "    address: 127.0.0.1",
                                f"    port: {data['nodes'][0]['ssh_port']}",
                                f"    host_key: {wrong_key}"]) + "\n")
    refused = run_cli("up", "--provider", "static", "--hosts", str(wrong), "--name", f"wr-{name}",
                      "--type", "docker-node", "--source", "distro", "--no-bootstrap", env=benv)
    assert refused.returncode == 1 and "rack-1" in refused.stderr, refused.stderr
    assert run_cli("status", f"wr-{name}", env=benv).returncode == 2
    verify = run_cli("verify", static, "-o", "json", env=benv)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert set(json.loads(verify.stdout)["hosts"]) == {"rack-1", "rack-2"}
    assert run_cli("up", "--provider", "docker", "--count", "1", "--name", static,
                   env=benv).returncode == 2  # name taken by the static cluster
    down = run_cli("down", static, "--yes", env=benv)
    assert down.returncode == 0 and "forgotten" in down.stderr
    containers, _ = labelled(name)
    assert len(containers) == 2  # the machines are untouched


# The second real DKMS build of the suite (the from-scratch node has the first): opt-in, for the
# machine time `make test` does not have (GPUPROV_E2E_REAL_DRIVER_MOVE=1, `make test-driver-move`).
REAL_DRIVER_MOVE = os.environ.get("GPUPROV_E2E_REAL_DRIVER_MOVE") == "1"


@pytest.mark.skipif(not REAL_DRIVER_MOVE, reason=(
    "opt-in: GPUPROV_E2E_REAL_DRIVER_MOVE=1 (`make test-driver-move`), a second real DKMS build of the R535 "
    "module, 8 minutes of two cores; `make test` proves the move on the signed fixture repository "
    "(test_patch_e2e.py, test_repo_trust.py) and Debian's real DKMS build on this file's from-scratch node"))
def test_patch_moves_the_driver_between_two_real_package_sets(cluster, benv, baked) -> None:
    """A running node moves by `gpuprov patch` between two real driver package sets, and
    verifies after. Debian 12 carries the proprietary R535 driver at two releases that both
    build against its kernel: 535.309.01 (bookworm-security, the pin) and 535.261.03
    (bookworm, gpuprov's checked earlier release); the node rolls back to 535.261.03: the
    whole driver (33 packages) goes down, DKMS builds the module again, the release pin and
    the holds move. (Debian's open flavour cannot be the pair: its only module, 535.261.03,
    does not build against bookworm's kernel; gpuprov/data/stack.toml.) The node is booted
    from the baked image (a minute instead of the whole bootstrap), and it is one node: the
    batch mechanics are proven in test_patch_e2e.py, and a second DKMS build on two cores
    would only double the wait."""
    name, _, _ = cluster
    image, _ = baked
    moved = f"mv-{name}"
    try:
        up = run_cli("up", "--provider", "docker", "--count", "1", "--name", moved, "--health", "off", "-o", "json",
                     env=benv, timeout=1200)
        assert up.returncode == 0, up.stderr[-3000:]
        assert json.loads(up.stdout)["image"]["ref"] == image["ref"]
        _move_the_driver(benv, moved, [f"{moved}-node-1"])
    finally:
        run_cli("down", moved, "--yes", env=benv)
        cleanup_labels(moved)


def _move_the_driver(benv: dict[str, str], name: str, nodes: list[str]) -> None:
    versions = "dpkg-query -W -f='${Package}=${Version} ' nvidia-driver nvidia-kernel-dkms libcuda1"
    before = {n: node_sh(n, versions) for n in nodes}
    assert all("nvidia-driver=535.309.01" in v for v in before.values()), before

    proc = run_cli("patch", name, "--driver", "535.261.03", "--batch", str(len(nodes)), "-o", "json", env=benv,
                   timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["ok"] and result["batches"] == [nodes], result
    for node in nodes:
        assert result["hosts"][node]["status"] == "patched", result["hosts"][node]
        # (dpkg-query lists in its own order, not the arguments')
        assert sorted(node_sh(node, versions).split()) == [
            "libcuda1=535.261.03-1", "nvidia-driver=535.261.03-1", "nvidia-kernel-dkms=535.261.03-1"]
        dkms = node_sh(node, "dkms status")
        assert "nvidia-current/535.261.03" in dkms and "535.309.01" not in dkms, dkms
        assert "Pin: version 535.261.03-*" in node_sh(node, "cat /etc/apt/preferences.d/gpuprov-nvidia-driver.pref")
        assert {"nvidia-driver", "nvidia-kernel-dkms", "libcuda1"} <= set(node_sh(node, "apt-mark showhold").split())
    assert json.loads(run_cli("status", name, "-o", "json", env=benv).stdout)["stack"]["driver"] == "535.261.03"
    # Verified after: the roll ran every probe against the new lock after the batch (and would
    # have stopped on one failing that passed before); read what they found. (The plan and
    # --check of such a move are proven in test_patch_e2e.py and the unit tests.)
    after = sorted((cluster_dir(benv, name) / "runs").glob("*-patch/probes-batch-1/probes.jsonl"))
    rows = [json.loads(line) for line in after[-1].read_text().splitlines() if line.strip()]
    dkms = [r for r in rows if r["probe"] == "dkms_module_for_every_kernel"]
    assert len(dkms) == len(nodes) and all(r["status"] == "pass" and "535.261.03" in r["detail"] for r in dkms), dkms
    assert not [r for r in rows if r["status"] == "fail"], [r for r in rows if r["status"] == "fail"]
    # The node now runs a lock its image was not baked for: status says so.
    assert "not the cluster's lock" in run_cli("status", name, env=benv, check=True).stdout


@pytest.mark.extended(why=(
    "`patch --onto-image`: both nodes replaced from the baked image (about 4 minutes of two cores); in "
    "`make test` a node boots from that image and converges with changed 0 (the test of `up --count 2` "
    "above), and a roll's batches, drains and resumes are tests/e2e/test_patch_e2e.py's"))
def test_patch_rolls_the_nodes_onto_the_baked_image(cluster, benv, baked, tmp_path) -> None:
    """`patch --onto-image`: a bad image is one line and exit 2; --check says what would be
    replaced from which image and changes nothing; the roll drains the old nodes, boots new ones
    from the image (the site converges on them with changed 0, their probes and health checks
    pass), removes the old ones and resumes the new ones, and the cluster records each
    replacement. One batch of both nodes: the batch mechanics are those of an in-place roll."""
    name, _, _ = cluster
    image, _ = baked
    old = [f"{name}-node-1", f"{name}-node-2"]
    before = labelled(name)[0]
    bad = run_cli("patch", name, "--onto-image", "gpuprov-test/none:nope", env=benv)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "no such baked image" in bad.stderr

    check = run_cli("patch", name, "--onto-image", "newest", "--check", "-o", "json", env=benv, timeout=300)
    planned = json.loads(check.stdout)
    assert check.returncode == 0 and planned["image"] == image["ref"], check.stderr
    assert {h: s["plan"] for h, s in planned["hosts"].items()} == {
        h: [f"replace with a node from {image['ref']}"] for h in old}
    assert labelled(name)[0] == before

    hooks = tmp_path / "hooks.log"
    proc = run_cli("patch", name, "--onto-image", "newest", "--batch", "2", "-o", "json",
                   "--drain", f'echo "drain $GPUPROV_NODE" >> {hooks}',
                   "--resume", f'echo "resume $GPUPROV_NODE" >> {hooks}', env=benv, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    new = [f"{name}-node-3", f"{name}-node-4"]
    assert result["ok"] and result["image"] == image["ref"] and result["batches"] == [old], result
    assert {h: (s["status"], s["replaced_by"], s["changed"]) for h, s in result["hosts"].items()} == {
        old[0]: ("replaced", new[0], 0), old[1]: ("replaced", new[1], 0)}
    assert result["lock"]["from"] == result["lock"]["to"] == image["lock_hash"]
    assert hooks.read_text().split("\n")[:-1] == [f"drain {old[0]}", f"drain {old[1]}",
                                                   f"resume {new[0]}", f"resume {new[1]}"]
    status = json.loads(run_cli("status", name, "-o", "json", env=benv, check=True).stdout)
    assert sorted(n["name"] for n in status["nodes"]) == new
    assert not set(before) & set(labelled(name)[0])  # the old containers are gone
    booted = {i["node"]: (i["image"], i["matches_lock"]) for i in status["images"]}
    assert booted == dict.fromkeys(new, (image["ref"], True)), booted
    assert run_cli("verify", name, env=benv).returncode == 0


def test_down_removes_containers_and_volumes(cluster, benv) -> None:
    name, _, _ = cluster
    assert labelled(name)[0]
    proc = run_cli("down", name, "--yes", env=benv)
    assert proc.returncode == 0, proc.stderr
    assert labelled(name) == ([], [])
    assert not cluster_dir(benv, name).exists()
    assert run_cli("verify", name, env=benv).returncode == 2
