"""Probes for containers on the node: Docker, the NVIDIA runtime, daemon.json, base images."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from gpuprov.lock.lock_data import LockData
from gpuprov.probes.nodefacts import held_packages, installed_version, read_text, require_systemd, unit_state
from gpuprov.probes.test_gpu import _gpus_expected

DAEMON_JSON = "/etc/docker/daemon.json"
DAEMON_JSON_BEFORE = "/etc/docker/daemon.json.before-gpuprov"
TOOLKIT_PACKAGES = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1"]
# Keys of daemon.json whose values gpuprov sets (a user's value for them may change).
OWNED = {("runtimes", "nvidia"), ("default-ulimits", "memlock"), ("default-ulimits", "stack"),
         ("default-runtime",)}


# What base_images pulled: each lock image with the digest pulled (the role writes it).
PULLED = "/var/lib/gpuprov/base-images.json"


def _docker(host, args: str):
    return host.run(f"docker {args}")


def _no_images(lock: LockData) -> str | None:
    """Why the node holds no base image of its lock (a line whose images are named by tag but
    not pinned by digest: base_images pulls none and builds no site image), or None."""
    if lock.get("base_images"):
        return None
    return (f"the lock pins no base image for CUDA {lock['cuda']} (its images are named by tag, not "
            "pinned by digest yet, or the lock predates the list): no image pulled, no site image built")


def _site_image(lock: LockData) -> str:
    """The site image of a lock, keyed by what goes into it (its CUDA images and pip
    requirements), so that a driver move keeps it; roles/gpuprov_lock/vars/main.yml names it the same."""
    content = ",".join(lock.get("base_images") or []) + "|" + ",".join(lock.get("site_pip_requirements") or [])
    return f"gpuprov/base:cuda{lock['cuda']}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


@pytest.mark.containers
def test_docker_active(host, report):
    require_systemd(host)
    service = unit_state(host, "docker")
    assert service.is_running, f"expected the docker service active, found {service}"
    assert service.is_enabled, f"expected the docker service enabled at boot, found {service}"
    out = _docker(host, "version --format '{{.Server.Version}}'")
    assert out.rc == 0, f"expected dockerd to answer, found: {(out.stderr or out.stdout).strip()[:200]}"
    report(f"dockerd {out.stdout.strip()} active and enabled")


@pytest.mark.containers
def test_docker_lists_the_nvidia_runtime(host, report):
    out = _docker(host, "info --format '{{json .Runtimes}}'")
    assert out.rc == 0, f"docker info failed: {out.stderr.strip()[:200]}"
    runtimes = json.loads(out.stdout)
    assert "nvidia" in runtimes, f"expected the nvidia runtime in docker info, found {sorted(runtimes)}"
    default = _docker(host, "info --format '{{.DefaultRuntime}}'").stdout.strip()
    report(f"runtimes: {', '.join(sorted(runtimes))}; default {default}")


@pytest.mark.containers
def test_container_toolkit_matches_the_lock(host, expect, report):
    lock = expect.lock()
    version = lock.get("container_toolkit")
    if not version:
        pytest.skip("this cluster's lock predates the container toolkit pin: no version to compare")
    found = {p: installed_version(host, p) for p in TOOLKIT_PACKAGES}
    wrong = {p: v for p, v in found.items() if not (v or "").startswith(f"{version}-")}
    assert not wrong, f"expected {TOOLKIT_PACKAGES} at {version}, found {wrong}"
    held = held_packages(host)
    loose = sorted(set(TOOLKIT_PACKAGES) - held)
    assert not loose, f"expected the toolkit held, not held: {loose}"
    report(f"nvidia-container-toolkit {found['nvidia-container-toolkit']}, held")


def _kept(before, now, path=()) -> list[str]:
    """Where ``now`` lost or changed something ``before`` had (gpuprov-owned keys aside)."""
    if path in OWNED:
        return []
    if isinstance(before, dict):
        if not isinstance(now, dict):
            return [f"{'.'.join(path)}: was an object, now {json.dumps(now)}"]
        lost = []
        for key, value in before.items():
            if key not in now and (*path, key) not in OWNED:
                lost.append(f"{'.'.join((*path, key))}: gone")
            elif key in now:
                lost += _kept(value, now[key], (*path, key))
        return lost
    if isinstance(before, list) and isinstance(now, list):
        missing = [item for item in before if item not in now]
        return [f"{'.'.join(path)}: lost {missing}"] if missing else []
    return [] if before == now else [f"{'.'.join(path)}: {json.dumps(before)} -> {json.dumps(now)}"]


@pytest.mark.containers
def test_daemon_json_keeps_the_keys_from_before(host, report):
    before_text = read_text(host, DAEMON_JSON_BEFORE)
    assert before_text is not None, (
        f"expected {DAEMON_JSON_BEFORE} (daemon.json as it was before gpuprov changed it), found none"
    )
    before = json.loads(before_text)
    now_text = read_text(host, DAEMON_JSON)
    assert now_text is not None, f"expected {DAEMON_JSON}, found none"
    now = json.loads(now_text)
    lost = _kept(before, now)
    assert not lost, f"expected every key daemon.json held before gpuprov kept, found: {'; '.join(lost)}"
    assert now.get("runtimes", {}).get("nvidia", {}).get("path") == "nvidia-container-runtime", (
        f"expected runtimes.nvidia in {DAEMON_JSON}, found {now.get('runtimes')}"
    )
    report(f"{len(before)} key(s) from before kept ({', '.join(sorted(before)) or 'none'}); nvidia runtime added")


@pytest.mark.images
def test_base_images_present(host, expect, report):
    lock = expect.lock()
    images = list(lock.get("base_images") or [])
    if not images:
        pytest.skip(_no_images(lock))
    record = read_text(host, PULLED)
    pulled = {r["image"]: r for r in json.loads(record)} if record is not None else {}
    problems, seen = [], []
    for image in images:
        name, _, digest = image.partition("@")
        if not digest:
            problems.append(f"{image}: the lock pins no digest")
            continue
        got = pulled.get(image)
        if got is None:
            problems.append(f"{image}: not pulled by gpuprov ({PULLED} has no record)")
            continue
        if got["digest"] != digest and not got.get("override"):
            problems.append(f"{image}: pulled {got['digest']}, not the lock's digest")
            continue
        out = _docker(host, f"image inspect --format '{{{{.Id}}}} {{{{json .RepoDigests}}}}' {got['pull']}")
        tag = _docker(host, f"image inspect --format '{{{{.Id}}}}' {name}")
        if out.rc != 0:
            problems.append(f"{got['pull']}: missing")
        elif tag.rc != 0 or tag.stdout.split()[:1] != out.stdout.split()[:1]:
            problems.append(f"{name}: the tag is not the image pulled by digest")
        else:
            seen.append(f"{name}@{got['digest'][:19]}" + (" (mirror's digest)" if got.get("override") else ""))
    site = _site_image(lock)
    if _docker(host, f"image inspect --format '{{{{.Id}}}}' {site}").rc != 0:
        problems.append(f"{site}: missing")
    assert not problems, f"expected the lock's images pulled by digest and the site image: {'; '.join(problems)}"
    report(f"{len(seen) + 1} image(s) present: {', '.join(seen)}, {site}")


@pytest.mark.images
def test_site_image_built_from_the_lock(host, expect, report):
    lock = expect.lock()
    if _no_images(lock):
        pytest.skip(_no_images(lock))
    image = _site_image(lock)
    out = _docker(host, f"image inspect --format '{{{{json .Config.Labels}}}}' {image}")
    assert out.rc == 0, f"expected the site image {image}, found none"
    labels = json.loads(out.stdout) or {}
    # The image is named by what goes into it, so a driver move keeps it: its gpuprov.lock label
    # names the lock it was built under, which may be an earlier one.
    want = {"gpuprov.cuda": lock["cuda"], "gpuprov.cudnn": lock["cudnn"]}
    wrong = {k: labels.get(k) for k, v in want.items() if labels.get(k) != v}
    assert not wrong, f"expected {image} labelled {want}, found {wrong}"
    report(f"{image}: CUDA {lock['cuda']}, cuDNN {lock['cudnn']} (built under lock {labels.get('gpuprov.lock')})")


@pytest.mark.containers
@pytest.mark.gpu
def test_docker_run_gpus_all_sees_the_gpus(host, expect, report):
    want = _gpus_expected(host, expect)
    if _no_images(expect.lock()):
        pytest.skip(_no_images(expect.lock()))
    image = _site_image(expect.lock())
    out = _docker(host, f"run --rm --gpus all {image} nvidia-smi -L")
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    assert out.rc == 0 and len(gpus) == want, (
        f"expected `docker run --gpus all {image} nvidia-smi -L` to list {want} GPU(s), found "
        f"{len(gpus)}: {(out.stdout or out.stderr).strip()[:300]}"
    )
    report(f"{len(gpus)} GPU(s) seen in {image}")


@pytest.mark.images
@pytest.mark.gpu
def test_cuda_base_image_reports_the_locked_cuda(host, expect, report):
    _gpus_expected(host, expect)
    lock = expect.lock()
    if _no_images(lock):
        pytest.skip(_no_images(lock))
    images = [i.partition("@")[0] for i in lock.get("base_images") or [] if "runtime" in i] or [_site_image(lock)]
    out = _docker(host, f"run --rm --gpus all {images[0]} cat /usr/local/cuda/version.json")
    match = re.search(r'"cuda"\s*:\s*\{[^}]*"version"\s*:\s*"(\d+\.\d+)', out.stdout)
    assert out.rc == 0 and match and match.group(1) == lock["cuda"], (
        f"expected {images[0]} to report CUDA {lock['cuda']}, found "
        f"{match.group(1) if match else (out.stdout or out.stderr).strip()[:200]}"
    )
    report(f"{images[0]}: CUDA {match.group(1)}")


@pytest.mark.containers
@pytest.mark.gpu
def test_cdi_spec_matches_the_driver(host, expect, report):
    _gpus_expected(host, expect)
    module = read_text(host, "/sys/module/nvidia/version")
    assert module is not None, (
        f"expected the nvidia module loaded (driver {expect.lock()['driver']}) for the CDI spec to "
        "name, found none (/sys/module/nvidia/version)"
    )
    driver = module.strip()
    spec = read_text(host, "/etc/cdi/nvidia.yaml")
    assert spec is not None, "expected the CDI spec /etc/cdi/nvidia.yaml, found none"
    assert f"libcuda.so.{driver}" in spec, (
        f"expected /etc/cdi/nvidia.yaml made for driver {driver}, it names another"
    )
    report(f"/etc/cdi/nvidia.yaml for driver {driver}")
