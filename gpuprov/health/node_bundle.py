"""The node's own quick health, shipped: a zipapp of the gpuprov modules the quick level's
checks run on (gpuprov.health.node_check and what it imports, the catalog's data file among
them), built here from gpuprov's installed source, for the slurm role to copy to each node
(slurmd's HealthCheckProgram runs it: roles/slurm/files/gpuprov-slurm-health).

Only the standard library is imported by these modules (the node runs it as ``python3 -I -S``:
no site-packages; tests/unit/test_slurm_node_health.py proves it). The archive is the same
bytes for the same source: entries sorted, stored (no compressor's version in it), every time
and mode fixed, so a run that changes no source copies nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuprov import zipapp
from gpuprov.health import node_check
from gpuprov.health.facts import Expect
from gpuprov.lock.lock_data import LockData

if TYPE_CHECKING:
    from gpuprov.providers import Provider
    from gpuprov.state import NodeRecord

# The modules the quick level imports, relative to the package (gpuprov.health's __init__
# imports every level's checks, so the deep ones come too), and the catalog's data file.
FILES = (
    "__init__.py", "errors.py", "paths.py", "node_text.py",
    "catalog/__init__.py", "catalog/instance_types.json",
    "results/__init__.py", "results/shapes.py", "results/json_form.py", "results/costs.py",
    "results/manifest.py", "lock/__init__.py", "lock/lock_data.py",
    *(f"health/{m}.py" for m in ("__init__", "checks_deep", "checks_gpu", "checks_node", "checks_state", "dcgm",
                                  "facts", "floors", "gather", "nccl", "node_check", "parse", "xid")),
)
MAIN = b"import sys\n\nfrom gpuprov.health.node_check import main\n\nsys.exit(main())\n"
NAME = "node-health.pyz"


_BUNDLE = zipapp.Bundle(NAME, MAIN, FILES)
build = _BUNDLE.build  # the zipapp's bytes, from the source of the gpuprov this is
write = _BUNDLE.write  # the zipapp in a directory (rewritten only when its bytes differ), and its path


def play_vars(directory: Path, expected: Mapping[str, Expect]) -> dict[str, Any]:
    """The slurm play's variables for the node health: the zipapp's path here (written into
    ``directory``, the cluster's own) and each node's Expect as data, by node name."""
    return {"gpuprov_node_health_pyz": str(write(directory)),
            "gpuprov_node_health_expect": {name: node_check.expect_data(e) for name, e in expected.items()}}


def expectations(cluster: str, provider: Provider, nodes: Sequence[NodeRecord],
                 lock: LockData | None) -> dict[str, Expect]:
    """Each node's Expect as `gpuprov health NAME` makes it (gpuprov.health.run.cluster_health):
    the provider's expectations of the node and the cluster's lock."""
    return {n.name: Expect.of(provider.expectations(n), lock, f"gpuprov provision {cluster}") for n in nodes}
