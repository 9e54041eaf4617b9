"""The JSON form of gpuprov's results: one serialiser for every `-o json`, and the metadata keys
its dataclasses use (gpuprov.results.shapes). Imports nothing heavy: the CLI's `-o json` path
loads it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

OPTIONAL = "optional"  # metadata key: leave the field out of the JSON while it is None
JSON_NAME = "json"  # metadata key: the field's name in the JSON, where it is no Python name


def json_name(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get(JSON_NAME, f.name))


def serialise(obj: Any) -> Any:
    """The JSON form of a result (dataclasses, their lists and maps, plain data): every `-o json`."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = vars(obj)
        return {json_name(f): serialise(values[f.name]) for f in dataclasses.fields(obj)
                if not (f.metadata.get(OPTIONAL) and values[f.name] is None)}
    if isinstance(obj, Mapping):
        return {str(k): serialise(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [serialise(v) for v in obj]
    return obj
