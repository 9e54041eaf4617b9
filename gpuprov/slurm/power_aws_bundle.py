"""The power service of an elastic AWS cluster, shipped: a zipapp of the gpuprov modules
gpuprov.slurm.power_aws_node runs on (what it imports when it starts), for the slurm role to
copy to the controller, where its unit runs it as ``python3 -I power-aws.pyz`` with Debian's
python3-boto3 (the one package it needs beyond the standard library, imported only when it
first calls EC2). The same bytes for the same source (gpuprov.zipapp).
tests/unit/test_power_aws_bundle.py proves that every gpuprov module the service imports is in
it, and that it runs from it."""

from __future__ import annotations

from gpuprov import zipapp

FILES = (
    "__init__.py", "clock.py", "defaults.py", "errors.py", "identity.py", "lock_holder.py", "node_text.py",
    "paths.py", "ssh.py", "state.py", "state_choice.py", "validate.py",
    "lock/__init__.py", "lock/lock_data.py", "lock/stack_choice.py",
    "pricing/__init__.py", "pricing/regions.py",
    "providers/__init__.py", "providers/spec.py",
    *(f"providers/aws/{m}.py" for m in ("__init__", "api", "common", "power", "power_boot")),
    *(f"results/{m}.py" for m in ("__init__", "costs", "json_form", "manifest", "shapes")),
    "sharing/__init__.py", "sharing/choice.py",
    *(f"slurm/{m}.py" for m in ("__init__", "accounting", "conf", "drain", "elastic", "munge", "power_aws_node",
                                 "power_http", "power_rules", "scheduler", "scheduler_choice", "topology")),
)
MAIN = b"import sys\n\nfrom gpuprov.slurm.power_aws_node import main\n\nsys.exit(main())\n"
NAME = "power-aws.pyz"


_BUNDLE = zipapp.Bundle(NAME, MAIN, FILES)
build = _BUNDLE.build  # the zipapp's bytes, from the source of the gpuprov this is
write = _BUNDLE.write  # the zipapp in a directory (rewritten only when its bytes differ), and its path
