"""End to end through the real CLI: real containers with systemd, real SSH with
pinned host keys, real Ansible, real testinfra probes.

The suite's one node from scratch: the whole site (driver 535 with its real DKMS build, CUDA 11.8,
cuDNN 8.9, containers, real packages), verified and baked into an image for its lock. The image is
handed to tests/e2e/test_baked_cluster.py (tests/e2e/scratch_image.py) as soon as it is baked, so
that the suite's other worker grows a cluster from it (drift, check mode, the static provider, a
roll onto the image) while this unit goes on with what only the from-scratch node shows: what the
bootstrap left on it, its probes, the bake and what the image holds, and the whole site run again
on it with nothing to change. (From scratch twice would only prove the same install twice, at twice
the CPU on two cores.) What only needs a cluster whose plays run (host key refusal, secrets kept
out of the state, a second command, a killed controller, a lost node) is in test_cluster_faults.py.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.e2e.drift import assert_manifests, assert_verified
from tests.e2e.nodes import cleanup_labels, cluster_dir, labelled, node_sh
from tests.e2e.scratch_image import GROWN_UNIT, from_scratch, in_session, publish, remove_image

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def env(env: dict[str, str]) -> dict[str, str]:
    """Ansible's own linear strategy, the default users get: the whole site from scratch is
    proven on it (the other e2e units run Mitogen's, tests/suite_strategy.py)."""
    return {**env, "GPUPROV_ANSIBLE_STRATEGY": "linear"}


@pytest.fixture(scope="module")
def scratch(env: dict[str, str], request: pytest.FixtureRequest):
    """Node 1 from scratch, verified and baked (tests/e2e/scratch_image.py's record), the image
    published for the grown unit when it runs in this session (else removed at the end)."""
    name = f"e2e-{secrets.token_hex(3)}"
    grown_here = in_session(request.session, GROWN_UNIT)
    record = None
    try:
        try:
            record = from_scratch(env, name)
        except BaseException as exc:
            if grown_here:
                publish({"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"})
            raise
        if grown_here:
            publish({k: record[k] for k in ("ref", "lock_hash", "repo", "passed")})
        yield name, record
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)
        if record and not grown_here:
            remove_image(record)


def test_up_launches_and_bootstraps(scratch) -> None:
    name, record = scratch
    data, stderr = record["up"]
    assert data["cluster"] == name and data["provider"] == "docker"
    assert [n["name"] for n in data["nodes"]] == [f"{name}-node-1"]
    node = data["nodes"][0]
    assert node["address"] == "127.0.0.1" and node["ssh_port"] > 0
    assert node["state"] == "running" and node["instance_type"] == "docker-node"
    assert data["image"]["ref"] is None and "--no-baked" in data["image"]["reason"]
    boot = data["bootstrap"]
    assert boot["ok"] is True
    stats = boot["hosts"][f"{name}-node-1"]
    assert stats["failed"] == 0 and stats["unreachable"] == 0 and stats["changed"] > 0, stats
    # progress was reported per node while the playbook ran
    assert f"{name}-node-1: gpu_preflight" in stderr
    # Issue 53: `up` ran the probes before it called the cluster ready, and said so last.
    assert data["verify"]["ok"] is True and data["verdict"]["ready"] is True, data.get("verdict")
    assert stderr.rstrip().splitlines()[-1] == (f"{name}: ready: {data['verdict']['why']}; next: `gpuprov ssh {name}`")
    assert "next: gpuprov verify" not in stderr  # `up` verified: no step left to name
    # The bootstrap installed about 2 GiB of packages (driver, CUDA's toolkit); the preflight's
    # DPkg::Post-Invoke hook removed each download once dpkg had installed it.
    node = f"{name}-node-1"
    assert node_sh(node, "test -f /etc/apt/apt.conf.d/90gpuprov-clean-downloads && echo yes").strip() == "yes"
    assert node_sh(node, "dpkg-query -W -f '${Status}' nvidia-cuda-toolkit").endswith("installed")
    assert node_sh(node, "find /var/cache/apt/archives -name '*.deb' | wc -l").strip() == "0"


def test_verify_passes_or_skips_with_reason(scratch, env) -> None:
    """The from-scratch node's probes, as `up` ran them (the grown unit holds its nodes to exactly
    these passes); the cluster they leave is verified, and its verify run recorded."""
    name, record = scratch
    assert_verified(record["verify"], {f"{name}-node-1"})
    assert record["passed"] and "dkms_module_for_every_kernel" in record["passed"]
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert status["state"] == "verified"
    kinds = [r["kind"] for r in status["runs"]]
    assert "verify-quick" in kinds and "provision" in kinds, kinds


def test_a_converged_node_holds_its_manifest_root_only(scratch, env) -> None:
    """Issue 34: the node converged from scratch holds the manifest of its whole-site run, root's
    alone; the state records its digest (the nodes from the image: the grown unit)."""
    name, _ = scratch
    assert_manifests(env, name, [f"{name}-node-1"])


def test_up_again_resumes_where_it_stopped_and_is_idempotent(scratch, env) -> None:
    """Trust review finding 13: an `up` killed after the node answered (SIGKILL: nothing after it
    ran) leaves the cluster at "reachable", not "running"; `up` again bootstraps from there and
    verifies, and once verified has nothing to resume (and probes nothing again). The run again is the whole site on the node converged
    from scratch, with nothing to change: the site's idempotence on a real from-scratch node."""
    name, record = scratch
    from gpuprov.manifest import steps as manifests
    from gpuprov.state import Store

    node = f"{name}-node-1"
    store = Store(Path(env["GPUPROV_HOME"]) / "state.db")
    store.set_cluster_state(name, "reachable")  # where a killed `up` leaves it
    # ... and the node's manifest record dropped, as a run does for the nodes it converges until
    # they succeed.
    manifests.forget(store, name, store.get_cluster(name).nodes)
    status = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)
    assert status["state"] == "reachable"
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "-o", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert [n["id"] for n in again["nodes"]] == [n["id"] for n in record["up"][0]["nodes"]]
    hosts, manifest = again["bootstrap"]["hosts"], again["bootstrap"]["manifest"]
    assert set(hosts) == {node} and manifest[node]["action"] == "full run", manifest
    assert hosts[node]["changed"] == 0 and hosts[node]["tasks"] > 50, hosts
    # ... and, bootstrapped, probed before it is called ready (issue 53): verified.
    assert again["verdict"]["ready"] is True and again["verify"]["ok"] is True, again.get("verdict")
    assert store.get_cluster(name).state == "verified"
    proc = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "-o", "json", env=env)
    assert proc.returncode == 0 and "already verified; nothing to resume" in proc.stderr
    done = json.loads(proc.stdout)
    assert done["bootstrap"]["resumed_from"] == "verified" and "verify" not in done  # no probe run again
    assert done["verdict"] == {"ready": True, "why": "1 node(s) verified already", "next": f"gpuprov ssh {name}"}


def _in_image(ref: str, command: str) -> str:
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", ref,
                           "-c", command], capture_output=True, text=True, check=True, timeout=300).stdout


def test_bake_captures_a_verified_node_for_its_lock_and_nothing_secret(scratch, env) -> None:
    """Issue 15: the node is verified, then captured; the image is labelled with the
    cluster's lock, lists under `image list`, and holds no key, id, credential or log of the
    node it came from (a look inside it). The node itself runs on, untouched."""
    name, record = scratch
    image, stderr = record["bake"]
    lock = json.loads(run_cli("status", name, "-o", "json", env=env, check=True).stdout)["stack"]
    assert image["lock_hash"] == lock["hash"] and image["source"] == f"{name}/{name}-node-1"
    assert image["ref"].startswith(f"{env['GPUPROV_BAKED_REPO']}:{lock['hash']}-")
    assert image["lock"]["driver"] == lock["driver"] and image["lock"]["cuda"] == lock["cuda"]
    assert f"{name}-node-1: verified; baking an image for lock {lock['hash']}" in stderr
    assert "clean: SSH host keys" in stderr and "clean: done" in stderr
    listed = json.loads(run_cli("image", "list", "-o", "json", env=env, check=True).stdout)
    assert [i["ref"] for i in listed] == [image["ref"]]
    pubkey = (cluster_dir(env, name) / "id_ed25519.pub").read_text().split()[1]
    host_key = (cluster_dir(env, name) / "hostkeys" / f"{name}-node-1.pub").read_text().split()[1]
    inside = _in_image(image["ref"], (
        "ls /etc/ssh/ | grep -c _key; ls -A /home/gpuprov/.ssh /root/.ssh 2>/dev/null | grep -c keys; "
        "wc -c < /etc/machine-id; ls /var/lib/apt/lists | wc -l; ls /etc/apt/apt.conf.d; "
        "grep -rlI -e 'PRIVATE KEY' -e '" + pubkey + "' -e '" + host_key + "' /etc /home /root /var/lib/cloud "
        "/var/log 2>/dev/null; find /var/log -type f -size +0 | head -5; echo ---; "
        "ls /var/lib/docker; dpkg-query -W -f='${Version}' nvidia-driver"))
    before, after = inside.split("---\n")
    lines = before.splitlines()
    assert lines[:4] == ["0", "0", "0", "0"], inside  # host keys, authorized keys, machine id, apt lists
    assert "01gpuprov-proxy" not in before and "PRIVATE" not in before and len(lines) >= 5, inside
    assert not [ln for ln in lines[4:] if ln.startswith("/")], inside  # no secret file, no log with content
    # What the image must keep: the node's Docker images (its volume, copied in) and the stack.
    assert "image" in after.split() and "535.309.01" in after, after
    assert run_cli("exec", name, "--", "test", "-s", "/etc/ssh/ssh_host_ed25519_key", env=env).returncode == 0


def test_the_image_is_for_its_lock_alone(scratch, env) -> None:
    """Issue 15: another lock's cluster never picks the image (and is flagged when told to
    boot from it), --no-baked forces the default image, and an image in use is not deleted."""
    name, record = scratch
    image, _ = record["bake"]
    plain = run_cli("up", "--provider", "docker", "--count", "1", "--name", "nb", "--no-baked", "--dry-run",
                    env=env, check=True)
    assert "image: the default image (--no-baked" in plain.stderr
    other = run_cli("up", "--provider", "docker", "--count", "1", "--name", "ol", "--driver", "535.261.03",
                    "--dry-run", env=env, check=True)
    assert "no image baked for lock" in other.stderr
    told = f"ol-{name}"
    try:
        run_cli("up", "--provider", "docker", "--count", "1", "--name", told, "--driver", "535.261.03",
                "--image", image["ref"], "--no-bootstrap", env=env, check=True)
        table = run_cli("status", told, env=env, check=True).stdout
        assert f"booted from {image['ref']}, baked for lock {image['lock_hash']}, not the cluster's lock" in table
        assert run_cli("image", "delete", image["ref"], "--yes", env=env).returncode == 2  # in use
    finally:
        run_cli("down", told, "--yes", env=env)
        cleanup_labels(told)


def test_down_removes_containers_and_volumes(scratch, env) -> None:
    name, _ = scratch
    assert labelled(name)[0]
    proc = run_cli("down", name, "--yes", env=env)
    assert proc.returncode == 0, proc.stderr
    assert labelled(name) == ([], [])
    assert not cluster_dir(env, name).exists()
    assert run_cli("verify", name, env=env).returncode == 2
