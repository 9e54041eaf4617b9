"""The stored lock's type (gpuprov.lock.lock_data.LockData) against the dataclass it is written
from: the same fields, each of the same type, plus the stored hash."""

from __future__ import annotations

import dataclasses
import typing

from gpuprov.lock import lock_data, stack


def test_the_stored_lock_has_every_field_of_the_lock_and_its_hash() -> None:
    fields = {f.name for f in dataclasses.fields(stack.Lock)}
    keys = set(lock_data.LockData.__annotations__)
    assert keys - fields == {"hash"}
    assert fields - keys == set()


def test_each_field_holds_the_type_the_lock_writes() -> None:
    hints = typing.get_type_hints(stack.Lock)
    stored = typing.get_type_hints(lock_data.LockData)
    # Tuples of the dataclass are lists once the lock has been through JSON: both are sequences.
    def same(a: object, b: object) -> bool:
        if typing.get_origin(a) is tuple and typing.get_origin(b) is not None:
            return typing.get_args(a)[0] == typing.get_args(b)[0]
        return a == b
    odd = {k: (hints[k], stored[k]) for k in hints if not same(hints[k], stored[k])}
    assert odd == {}


def test_a_resolved_lock_as_stored_holds_only_the_typed_keys() -> None:
    lock = stack.resolve("p4d.24xlarge").as_dict()
    assert set(lock) <= set(lock_data.LockData.__annotations__)
    assert isinstance(lock["hash"], str) and len(lock["hash"]) == 12
