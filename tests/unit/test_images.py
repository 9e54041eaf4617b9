"""Which image `up` boots new nodes from, and what the bake's clean-up removes."""

from __future__ import annotations

import pytest

from gpuprov import images
from gpuprov.core.status import node_images
from gpuprov.errors import BadInput
from gpuprov.images import BakedImage
from gpuprov.providers.docker.images import LABEL_VALUE, repository
from gpuprov.state import NodeRecord

LOCK = {"hash": "aaaaaaaaaaaa", "driver": "535.309.01", "source": "distro", "cuda": "11.8"}


def baked(ref: str, lock_hash: str, created: str) -> BakedImage:
    return BakedImage(id=f"sha256:{ref}", ref=ref, provider="docker", lock_hash=lock_hash,
                      created=created, source="demo/demo-node-1", lock={})


IMAGES = [baked("b:old", "aaaaaaaaaaaa", "2026-11-01T00:00:00Z"),
          baked("b:new", "aaaaaaaaaaaa", "2026-11-20T00:00:00Z"),
          baked("b:other", "bbbbbbbbbbbb", "2026-11-24T00:00:00Z")]


def test_the_newest_image_of_the_lock_is_chosen_and_named() -> None:
    choice = images.choose(IMAGES, LOCK, explicit=None, no_baked=False)
    assert choice.ref == "b:new" and choice.baked is IMAGES[1]
    assert "baked for lock aaaaaaaaaaaa from demo/demo-node-1" in choice.reason


def test_an_image_of_another_lock_is_never_chosen() -> None:
    choice = images.choose(IMAGES[2:], LOCK, explicit=None, no_baked=False)
    assert choice.ref is None and choice.baked is None
    assert "no image baked for lock aaaaaaaaaaaa" in choice.reason


def test_no_baked_and_image_win() -> None:
    assert images.choose(IMAGES, LOCK, explicit=None, no_baked=True).ref is None
    explicit = images.choose(IMAGES, LOCK, explicit="b:old", no_baked=False)
    assert explicit.ref == "b:old" and explicit.reason == "b:old (--image)"
    other = images.choose(IMAGES, LOCK, explicit="b:other", no_baked=False)
    assert other.ref == "b:other" and "not this cluster's lock aaaaaaaaaaaa" in other.reason


def test_status_flags_a_node_of_another_locks_image() -> None:
    def node(name: str, **extra: str) -> NodeRecord:
        return NodeRecord(name=name, id=name, address="127.0.0.1", ssh_port=22, user="u", state="running",
                          extra=extra)

    rows = node_images([node("n1", image="b:new", image_lock="aaaaaaaaaaaa"),
                        node("n2", image="b:other", image_lock="bbbbbbbbbbbb"),
                        node("n3", image="gpuprov/node:bookworm"), node("n4")], "aaaaaaaaaaaa")
    assert [(r.node, r.matches_lock) for r in rows] == [("n1", True), ("n2", False), ("n3", None)]
    assert images.mismatched([node("n2", image_lock="bbbbbbbbbbbb")], "aaaaaaaaaaaa") == [("n2", "bbbbbbbbbbbb")]


@pytest.mark.parametrize("value", ['x" LABEL evil="1', "a b", "x\nRUN id", "$(id)", "a\"b"])
def test_a_label_value_that_could_escape_the_instruction_is_refused(value: str) -> None:
    assert not LABEL_VALUE.fullmatch(value)


@pytest.mark.parametrize("repo", ["Gpuprov/baked", "a b", "x;y", "../x", ""])
def test_a_bad_baked_repository_name_is_one_line(monkeypatch: pytest.MonkeyPatch, repo: str) -> None:
    monkeypatch.setenv("GPUPROV_BAKED_REPO", repo)
    with pytest.raises(BadInput, match="GPUPROV_BAKED_REPO"):
        repository()
