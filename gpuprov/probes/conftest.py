"""Fixtures shared by every probe.

``GPUPROV_EXPECTATIONS`` holds JSON (inline, or a path to a file):
``{"<node>": {"gpus": 8, "instance_type": "p4d.24xlarge", ...}, "*": {...}}``;
``"*"`` applies to nodes without an entry of their own (molecule uses it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuprov.lock import stack
from gpuprov.lock.lock_data import LockData


@dataclass(frozen=True)
class Expectation:
    node: str
    instance_type: str | None
    gpus: int | None
    gpu_model: str | None
    nvswitch: bool | None
    virtualization: str
    stack: LockData | None = None

    def lock(self) -> LockData:
        """The node's version lock; a probe that needs one skips, saying so, without it."""
        if not self.stack:
            pytest.skip(f"no version lock for {self.node}: `gpuprov provision` resolves one")
        return self.stack

    def why_no_gpu(self) -> str:
        kind = self.instance_type or "this node"
        return f"{kind} has no GPU (catalog: 0 GPUs)"


def _expectations() -> dict[str, Any]:
    raw = os.environ.get("GPUPROV_EXPECTATIONS", "").strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        return json.loads(raw)
    return json.loads(Path(raw).read_text())


_EXPECTATIONS = _expectations()


@pytest.fixture
def node(host: Any) -> str:
    backend = host.backend
    return getattr(backend, "host", None) or backend.get_hostname()


@pytest.fixture
def expect(node: str) -> Expectation:
    data = _EXPECTATIONS.get(node) or _EXPECTATIONS.get("*") or {}
    gpus = data.get("gpus")
    return Expectation(
        node=node,
        instance_type=data.get("instance_type"),
        gpus=None if gpus in (None, "") else int(gpus),
        gpu_model=data.get("gpu_model"),
        nvswitch=data.get("nvswitch"),
        virtualization=data.get("virtualization") or "unknown",
        stack=data.get("stack") or _resolve(data.get("stack_request")),
    )


def _resolve(request: dict[str, Any] | None) -> LockData | None:
    """A lock resolved from a request ({"instance_type", "source", ...}): molecule's way."""
    if not request:
        return None
    return stack.resolve(**request).as_dict()


@pytest.fixture
def report(request: pytest.FixtureRequest):
    """Record what the probe found; shown as the probe's detail when it passes."""

    def _report(text: str) -> None:
        request.node.user_properties.append(("detail", text))

    return _report


@pytest.fixture(autouse=True)
def _tag_host(request: pytest.FixtureRequest, node: str) -> None:
    request.node.user_properties.append(("host", node))
