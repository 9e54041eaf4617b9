"""The suite's one node from scratch, handed on as an image: what tests/e2e/test_docker_cluster.py
(the from-scratch unit) gives tests/e2e/test_baked_cluster.py (the unit grown from its image).

A run of `make test` bootstraps one node from scratch with the real DKMS build (about 20 minutes
of one of two cores on the slow machine kind), verifies it and bakes it into an image for its
lock. The tests of a cluster grown from that image (drift, check mode, the static provider, a
roll onto the image) are another unit of work, so that the suite's other worker runs them while
this one goes on with the from-scratch node's own tests: the from-scratch unit publishes the
image here as soon as it is baked, and the grown unit waits for it (bounded), or fails at once
with the from-scratch unit's reason when that one failed. Run alone (`pytest
tests/e2e/test_baked_cluster.py`, no from-scratch unit in the session), the grown unit makes the
node and the image itself.

The hand-over is a JSON file named after the run (pytest-xdist's PYTEST_XDIST_TESTRUNUID, the
same in every worker of a run; a random id in a run without workers), written whole by rename.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.conftest import GROWN_UNIT, SCRATCH_UNIT, remove_images, run_cli
from tests.e2e.nodes import cleanup_labels

__all__ = ["GROWN_UNIT", "SCRATCH_UNIT"]
RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or secrets.token_hex(8)
# How long the grown unit waits for the image: the from-scratch node and its bake took 1546 s on
# the slow machine kind on its slowest day (docs/performance-history.md, 2026-11-29 (3)), 1999 s
# for the `up` alone on a slower AMD EPYC (2026-12-02) and past 2400 s there with other work
# beside the suite; its unit starts first. The `up` is bounded by UP_S, the bake by BAKE_S.
UP_S = 3600
BAKE_S = 1800
WAIT_S = UP_S + BAKE_S


def handoff_file() -> Path:
    return Path(tempfile.gettempdir()) / "gpuprov-suite" / f"scratch-image-{RUN}.json"


def in_session(session: Any, unit: str) -> bool:
    """Whether a test of ``unit`` (a test file) was collected in this run."""
    return any(item.nodeid.split("::", 1)[0].split("@", 1)[0] == unit for item in session.items)


def publish(record: dict[str, Any]) -> None:
    path = handoff_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def wait_for(deadline_s: float = WAIT_S) -> dict[str, Any]:
    """The from-scratch unit's record once it is written: its image, or why there is none."""
    path, until = handoff_file(), time.monotonic() + deadline_s
    while not path.exists():
        if time.monotonic() > until:
            raise AssertionError(f"no image from {SCRATCH_UNIT} after {deadline_s:.0f} s ({path})")
        time.sleep(5)
    record = json.loads(path.read_text())
    if record.get("error"):
        raise AssertionError(f"{SCRATCH_UNIT} made no image: {record['error']}")
    return record


def remove_image(record: dict[str, Any] | None) -> None:
    """The from-scratch image and every other image its repository got (the grown unit bakes
    there too), and the hand-over."""
    if record:
        remove_images(record["repo"])
    handoff_file().unlink(missing_ok=True)


def handed_over(repo: str) -> bool:
    """Whether ``repo``'s images are the grown unit's now (its hand-over is there): the
    from-scratch unit's module then leaves them to it (tests/conftest.py's ``env``)."""
    try:
        return json.loads(handoff_file().read_text()).get("repo") == repo
    except (OSError, ValueError, AttributeError):
        return False


def passed_probes(verified: dict[str, Any]) -> list[str]:
    """The probes that passed on every node of a `verify -o json` document, sorted."""
    hosts = verified["hosts"]
    sets = [{p["probe"] for p in probes if p["status"] == "pass"} for probes in hosts.values()]
    return sorted(set.intersection(*sets)) if sets else []


def from_scratch(env: dict[str, str], name: str) -> dict[str, Any]:
    """One node from scratch (the whole site, the driver's DKMS build), verified by `up` itself
    (its probes once bootstrapped and healthy) and baked: the `up` and `image bake` results and
    the probes that passed, as published. The node stays."""
    first = run_cli("up", "--provider", "docker", "--count", "1", "--name", name, "--no-baked", "-o", "json",
                    env=env, timeout=UP_S)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    up = json.loads(first.stdout)
    bake = run_cli("image", "bake", "--from", name, "-o", "json", env=env, timeout=BAKE_S)
    assert bake.returncode == 0, bake.stderr[-3000:]
    image = json.loads(bake.stdout)
    return {"ref": image["ref"], "lock_hash": image["lock_hash"], "repo": env["GPUPROV_BAKED_REPO"],
            "passed": passed_probes(up["verify"]), "up": (up, first.stderr),
            "bake": (image, bake.stderr), "verify": up["verify"]}


def made_alone(env: dict[str, str]) -> dict[str, Any]:
    """The grown unit run without the from-scratch one: the node and its image made here, the
    node removed once baked."""
    name = f"scr-{secrets.token_hex(3)}"
    try:
        return from_scratch(env, name)
    finally:
        run_cli("down", name, "--yes", env=env)
        cleanup_labels(name)
