"""The FIXTURE registry the local flow pulls images from (tests/fixtures/registry.py, scripts/
registry.sh; issue 54, item 10): the digests handed to the roles are the ones skopeo computed of
what it pushed from the locally built seed image, never what a registry answered; the registry
the nodes reach serves its storage read-only, so nothing on the bridge can push an image under
a seeded name; and a served digest that is not the seeded one stops the set-up. On loopback,
in a storage of its own (the machine's registry is left alone)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.fixtures import registry

pytestmark = pytest.mark.e2e

NAMES = ["nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04@sha256:" + "0" * 64, "gpuprov/probe:seeded"]


def test_seeded_digests_are_skopeos_and_the_served_registry_refuses_pushes(tmp_path) -> None:
    seeded = registry.seed(tmp_path, NAMES)
    record = json.loads((tmp_path / registry.SEEDED).read_text())
    assert record["digests"] == seeded and set(seeded) == {registry.tag_name(n) for n in NAMES}
    assert all(d.startswith("sha256:") and len(d) == 71 for d in seeded.values()), seeded
    # Seeding again with the same seed image pushes nothing (no registry is started).
    started = (tmp_path / "seed-config.yml").stat().st_mtime_ns
    assert registry.seed(tmp_path, NAMES) == seeded
    assert (tmp_path / "seed-config.yml").stat().st_mtime_ns == started

    port = registry.free_port("127.0.0.1")
    served = registry.start("127.0.0.1", port, tmp_path)
    try:
        address = f"127.0.0.1:{port}"
        assert registry.check(address, tmp_path) == seeded
        assert registry.digests(address, NAMES) == seeded
        # Anything on the bridge pushing under a seeded name is refused: the storage is read-only.
        push = subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                               f"docker-daemon:{registry.SEED_IMAGE}", f"docker://{address}/gpuprov/probe:seeded"],
                              capture_output=True, text=True, check=False, timeout=300)
        assert push.returncode != 0 and "405" in push.stderr, push.stderr
        assert registry.check(address, tmp_path) == seeded
        # A served digest that is not the seeded one is named, and stops the set-up.
        forged = {**record, "digests": {**seeded, "gpuprov/probe:seeded": "sha256:" + "1" * 64}}
        (tmp_path / registry.SEEDED).write_text(json.dumps(forged))
        with pytest.raises(RuntimeError, match="serves gpuprov/probe:seeded as sha256:"):
            registry.check(address, tmp_path)
    finally:
        served.terminate()
        served.wait(timeout=10)
