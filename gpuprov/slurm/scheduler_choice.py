"""What a command asks of a cluster's scheduler (`--scheduler`, `--slurm-controller`,
`--slurm-controller-only`, `--max-count`, `--idle-minutes`, `--replace-unhealthy`, `--no-accounting`,
`--slurm-dbd`), typed and
checked: a leaf, so the command line builds it (gpuprov.slurm.scheduler keeps it with the
cluster and serves it to the slurm play; gpuprov.slurm.elastic checks the dynamic nodes
against the cluster)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuprov import defaults
from gpuprov.errors import BadInput

# A node name as gpuprov and Slurm both accept it (no spaces, '=', '#', ',' or brackets).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


@dataclass(frozen=True)
class Replacement:
    """`--replace-unhealthy`: a static node drained by its own health, once its jobs have ended,
    is replaced by a fresh one from the cluster's image (gpuprov.core.replace_unhealthy),
    converged with the plays of the command that turned it on (``plays``: its `--tags`; empty:
    the whole site) and held to the same health gate (``health``)."""

    plays: tuple[str, ...] = ()
    health: str = "quick"

    def as_option(self) -> dict[str, Any]:
        return {"plays": list(self.plays), "health": self.health}

    @classmethod
    def from_option(cls, raw: Any) -> Replacement | None:
        if not isinstance(raw, dict):
            return None
        plays = raw.get("plays") or []
        return cls(plays=tuple(str(p) for p in plays) if isinstance(plays, list) else (),
                   health=str(raw.get("health") or "quick"))


@dataclass(frozen=True)
class Scheduler:
    kind: str = defaults.DEFAULT_SCHEDULER
    controller: str | None = None  # a node name; None: the cluster's first node
    controller_only: bool = False  # the controller runs no slurmd
    max_count: int | None = None  # static and dynamic nodes together; None: no dynamic nodes
    idle_minutes: int | None = None  # a dynamic node's idle time before it is powered down
    accounting: bool = True  # slurmdbd with MariaDB on the controller (--no-accounting: none)
    dbd: str | None = None  # the node slurmdbd and MariaDB run on; None: the controller
    replace: Replacement | None = None  # `--replace-unhealthy`; None: a drained static node stays

    def checked(self) -> Scheduler:
        """BadInput (one line) for a choice that cannot be: an unknown scheduler, a controller
        that is no node name, controller flags without Slurm."""
        if self.kind not in defaults.SCHEDULERS:
            raise BadInput(f"--scheduler {self.kind}: one of {', '.join(defaults.SCHEDULERS)}")
        if self.kind != "slurm" and (self.controller or self.controller_only):
            raise BadInput("--slurm-controller and --slurm-controller-only go with --scheduler slurm")
        if self.kind != "slurm" and (self.max_count is not None or self.idle_minutes is not None):
            raise BadInput(f"--max-count and --idle-minutes: dynamic nodes are Slurm's (--scheduler slurm); "
                           f"this cluster's scheduler is {self.kind}")
        if self.kind != "slurm" and not self.accounting:
            raise BadInput("--no-accounting goes with --scheduler slurm (accounting is Slurm's)")
        if self.max_count is None and self.idle_minutes is not None:
            raise BadInput("--idle-minutes goes with --max-count (the dynamic nodes it powers down)")
        if self.replace is not None and (self.kind != "slurm" or self.max_count is None):
            raise BadInput("--replace-unhealthy goes with --scheduler slurm and --max-count (the cluster's power "
                           "service and image replace the nodes; --max-count equal to --count: no dynamic node)")
        if self.controller is not None and not NODE_NAME.fullmatch(self.controller):
            raise BadInput(f"--slurm-controller {self.controller!r}: not a node name")
        if self.dbd is not None:
            if self.kind != "slurm":
                raise BadInput("--slurm-dbd goes with --scheduler slurm")
            if not self.accounting:
                raise BadInput("--slurm-dbd names where Slurm's accounting runs: it cannot go with --no-accounting")
            if not NODE_NAME.fullmatch(self.dbd):
                raise BadInput(f"--slurm-dbd {self.dbd!r}: not a node name")
        return self

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Scheduler:
        """The choice a cluster's record keeps (as_options), read back."""
        return cls(kind=options.get("scheduler") or defaults.DEFAULT_SCHEDULER,
                   controller=options.get("slurm_controller"),
                   controller_only=bool(options.get("slurm_controller_only")),
                   max_count=options.get("slurm_max_count"), idle_minutes=options.get("slurm_idle_minutes"),
                   accounting=options.get("slurm_accounting", True) is not False,
                   dbd=options.get("slurm_dbd"),
                   replace=Replacement.from_option(options.get("slurm_replace_unhealthy")))

    def as_options(self) -> dict[str, Any]:
        """How a cluster's record keeps it (its spec's options)."""
        if self.kind == defaults.DEFAULT_SCHEDULER:
            return {}
        return {"scheduler": self.kind, **({"slurm_controller": self.controller} if self.controller else {}),
                **({"slurm_controller_only": True} if self.controller_only else {}),
                **({"slurm_max_count": self.max_count} if self.max_count is not None else {}),
                **({"slurm_idle_minutes": self.idle_minutes} if self.idle_minutes is not None else {}),
                **({"slurm_accounting": False} if not self.accounting else {}),
                **({"slurm_dbd": self.dbd} if self.dbd else {}),
                **({"slurm_replace_unhealthy": self.replace.as_option()} if self.replace else {})}
