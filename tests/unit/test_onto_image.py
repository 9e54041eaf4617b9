"""`patch --onto-image`: which image a roll replaces nodes from, and what is refused before
anything is touched (the roll itself runs for real in tests/e2e/test_docker_cluster.py)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuprov.core import onto_image
from gpuprov.core.patch_plan import request
from gpuprov.errors import BadInput
from gpuprov.images import BakedImage

LOCK = {"hash": "aaaaaaaaaaaa"}


def _image(ref: str, lock_hash: str, created: str) -> BakedImage:
    return BakedImage(id=f"sha256:{ref}", ref=ref, provider="docker", lock_hash=lock_hash, created=created,
                      source="c/c-node-1", lock={})


IMAGES = [_image("r:old", "aaaaaaaaaaaa", "2026-11-01T00:00:00Z"), _image("r:new", "aaaaaaaaaaaa", "2026-11-02T00:00:00Z"),
          _image("r:other", "bbbbbbbbbbbb", "2026-11-03T00:00:00Z")]


def test_newest_takes_the_newest_image_of_the_rolls_lock() -> None:
    assert onto_image.pick(IMAGES, "newest", LOCK).ref == "r:new"
    assert onto_image.pick(IMAGES, "newest", {"hash": "cccccccccccc"}) is None  # none yet: one is baked


def test_a_named_image_must_be_of_the_rolls_lock() -> None:
    assert onto_image.pick(IMAGES, "r:old", LOCK).ref == "r:old"
    assert onto_image.pick(IMAGES, "sha256:r:old", LOCK).ref == "r:old"
    with pytest.raises(BadInput, match="baked for lock bbbbbbbbbbbb, and the roll moves the cluster to lock aaaa"):
        onto_image.pick(IMAGES, "r:other", LOCK)
    with pytest.raises(BadInput, match="no such baked image"):
        onto_image.pick(IMAGES, "r:nope", LOCK)


def test_onto_image_alone_is_something_to_patch() -> None:
    assert request(onto_image="newest").onto_image == "newest"
    with pytest.raises(BadInput, match="nothing to patch"):
        request()


def test_kernel_and_microcode_are_in_place_only(gpuprov_home, monkeypatch) -> None:
    from gpuprov.state import Store

    Store().create_cluster("cc", "docker", {"count": 1}, lock={"hash": "aaaaaaaaaaaa"})
    monkeypatch.setattr(onto_image, "get_provider", lambda name: _Able())
    for flag in ("kernel", "microcode"):
        with pytest.raises(BadInput, match="--kernel and --microcode patch nodes in place"):
            onto_image.roll_onto_image("cc", request(onto_image="newest", **{flag: True}), console=None)


def test_a_provider_that_cannot_replace_nodes_is_refused(gpuprov_home) -> None:
    from gpuprov.state import Store

    Store().create_cluster("ss", "static", {"count": 1, "hosts_file": "h.yml"}, lock={"hash": "aaaaaaaaaaaa"})
    with pytest.raises(BadInput, match="cannot be replaced from an image"):
        onto_image.roll_onto_image("ss", request(onto_image="newest"), console=None)


def test_a_slurm_cluster_is_refused_before_anything_is_touched(gpuprov_home, monkeypatch) -> None:
    """Slurm knows its nodes by name: replacing them would leave slurm.conf listing nodes that are
    gone. Refused before an image is picked or baked, and no run is recorded."""
    from gpuprov.state import Store

    store = Store()
    store.create_cluster("sl", "docker", {"count": 2, "options": {"scheduler": "slurm"}}, lock={"hash": "aaaaaaaaaaaa"})
    monkeypatch.setattr(onto_image, "get_provider", lambda name: _Able())
    with pytest.raises(BadInput, match="sl runs Slurm, whose node list would lose the replaced nodes; patch it in place"):
        onto_image.roll_onto_image("sl", request(onto_image="newest"), console=None)
    with pytest.raises(BadInput, match="runs Slurm"):
        onto_image.roll_onto_image("sl", request(onto_image="newest", check=True), console=None)
    assert store.runs("sl") == []


class _Able:
    name = display_name = "docker"

    def supports(self, ability: str) -> bool:
        return True


def test_the_recorded_request_reads_back_with_new_counts_and_image() -> None:
    """New nodes for a cluster (or a throwaway one like it) come from its recorded request."""
    from gpuprov.state import ClusterRecord, NodeRecord

    node = NodeRecord(name="c-node-1", id="x", address="127.0.0.1", ssh_port=22, user="u", state="running")
    record = ClusterRecord(name="c", provider="docker", created="t0", state="bootstrapped", lock=None, nodes=(node,),
                           spec={"instance_type": "docker-node", "count": 1, "image": None, "options": {}})
    spec = onto_image.spec_of(record, image="gpuprov/baked:abc-1", count=3)
    assert (spec.count, spec.image, spec.no_baked) == (3, "gpuprov/baked:abc-1", False)
    assert onto_image.spec_of(record, image=None, no_baked=True, name="bake-1", count=1).name == "bake-1"
    assert onto_image.spec_of(dataclasses.replace(record, spec={**record.spec, "count": None}), image=None).count == 1
