"""The order `make test`'s workers take the units in (tests/conftest.py): the unit grown from the
node from scratch's image placed where that image will be near, so that no worker waits for it."""

from __future__ import annotations

import pytest

from tests.conftest import GROWN_UNIT, SCRATCH_UNIT, place_grown_unit, unit_seconds


class Item:
    """What the schedule reads of a collected test: its id and its markers (a FIXTURE of
    pytest.Item's two attributes, so that the order is checked without collecting the suite)."""

    def __init__(self, unit: str, test: str = "test_a", skip: bool = False) -> None:
        self.nodeid = f"{unit}::{test}"
        self.marks = {"skip": pytest.mark.skip(reason="opt-in").mark} if skip else {}

    def get_closest_marker(self, name: str):
        return self.marks.get(name)


def _units(items: list[Item]) -> list[str]:
    out: list[str] = []
    for item in items:
        unit = item.nodeid.split("::", 1)[0]
        if not out or out[-1] != unit:
            out.append(unit)
    return out


OTHERS = [f"tests/e2e/test_other_{i}.py" for i in range(12)]  # 200 s each (the e2e default)


def _suite(skip: set[str] = frozenset()) -> list[Item]:
    units = [SCRATCH_UNIT, GROWN_UNIT, *OTHERS]
    return [Item(u, t, skip=u in skip) for u in units for t in ("test_a", "test_b")]


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_the_grown_unit_starts_once_the_other_workers_had_the_image_s_time(workers: int) -> None:
    order = _units(place_grown_unit(_suite(), workers))
    wanted = (workers - 1) * 0.9 * unit_seconds(SCRATCH_UNIT)
    before = order[1:order.index(GROWN_UNIT)]
    assert order[0] == SCRATCH_UNIT and SCRATCH_UNIT not in before
    assert sum(unit_seconds(u) for u in before) >= wanted
    assert sum(unit_seconds(u) for u in before[:-1]) < wanted  # and no later than that
    assert sorted(order) == sorted([SCRATCH_UNIT, GROWN_UNIT, *OTHERS])


def test_the_grown_unit_keeps_its_tests_in_their_order() -> None:
    placed = place_grown_unit(_suite(), 2)
    assert [i.nodeid for i in placed if i.nodeid.startswith(GROWN_UNIT)] == \
        [f"{GROWN_UNIT}::test_a", f"{GROWN_UNIT}::test_b"]


def test_units_that_skip_whole_do_not_count_as_time_before_it() -> None:
    skipped = set(OTHERS[:3])
    order = _units(place_grown_unit(_suite(skipped), 2))
    before = order[1:order.index(GROWN_UNIT)]
    assert set(OTHERS[:3]) <= set(before)
    assert sum(unit_seconds(u) for u in before if u not in skipped) >= 0.9 * unit_seconds(SCRATCH_UNIT)


@pytest.mark.parametrize(("workers", "units"), [
    (1, [SCRATCH_UNIT, GROWN_UNIT, *OTHERS]),
    (2, [GROWN_UNIT, *OTHERS]),  # no from-scratch unit in the run: the grown one makes its own image
])
def test_the_order_stays_with_one_worker_or_without_the_scratch_unit(workers: int, units: list[str]) -> None:
    items = [Item(u) for u in units]
    assert place_grown_unit(items, workers) == items


def test_too_little_other_work_puts_it_last() -> None:
    items = [Item(SCRATCH_UNIT), Item(GROWN_UNIT), Item(OTHERS[0])]
    assert _units(place_grown_unit(items, 3)) == [SCRATCH_UNIT, OTHERS[0], GROWN_UNIT]
