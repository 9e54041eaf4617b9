"""The project's error types.

Every failure a user can meet is one of these; the CLI turns it into a single
line on stderr and an exit code in one place (``gpuprov.cli.app.main``).
"""

from __future__ import annotations

# `provision --check`: the check ran and found changes the real run would make (as `terraform
# plan -detailed-exitcode` says 2; 2 is bad input here). Not an error: a script gates on it.
CHANGES_PENDING = 3


class GpuprovError(Exception):
    """An operational failure: the request was valid but could not be done (exit 1)."""

    exit_code = 1


class BadInput(GpuprovError):
    """Bad usage or bad input, detected before anything was created or changed (exit 2)."""

    exit_code = 2


class NotSupported(BadInput):
    """A request for something the chosen provider cannot do (exit 2)."""


class ClusterBusy(GpuprovError):
    """Another gpuprov command holds the cluster's lock (its holder named): nothing was done, so
    trying again later is safe (exit 1)."""


class PartialLaunch(GpuprovError):
    """A launch that was undone but left nodes behind: ``leftover_nodes`` (NodeRecords) could
    not be removed and stay in state, so `down` finds them."""

    def __init__(self, message: str, leftover: list | None = None) -> None:
        super().__init__(message)
        self.leftover_nodes = list(leftover or [])


class DamagedFile(BadInput):
    """A local file gpuprov wrote that no longer holds what it wrote (a cache, the state
    database): one line naming the file, what is wrong and what to do (exit 2)."""

    def __init__(self, what: str, path: object, why: str, fix: str) -> None:
        super().__init__(f"{what} {path} is damaged ({why}); {fix}")
