"""The command registry: which module of gpuprov/core/ each command runs, imported when it runs.

`gpuprov --help`, and every command while click parses its flags, imports no command module:
a command's body asks for its module by the command's own name, ``core("down").down(...)``,
and only then is that module (and what it imports: boto3's side, Ansible's, the state store)
loaded. Python keeps it in ``sys.modules``, so a second call costs a dictionary look-up, and an
attribute is read from the module each time (a test that replaces ``gpuprov.core.up.up`` is
what the command calls).

``COMMANDS`` is the one table: a command's name as its user types it (a group's command with
its group, a flag that runs another module with its flag) to the module's dotted name. A new
command adds its row here and its name to ``Command``; tests/unit/test_command_registry.py
holds the table to the command line (every row a command or flag that exists, every module in
gpuprov/core/, no module of gpuprov/cli/ importing gpuprov.core itself) and to start-up, and
tests/unit/test_import_graph.py reads the rows as the registry's imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Final, Literal

Command = Literal[
    "up", "down", "list", "status", "inventory", "settings", "provision", "verify", "verify --local",
    "exec", "ssh", "ssh-config", "image bake", "image list", "image delete", "monitor", "patch",
    "patch --onto-image", "power-service", "usage", "settings --set", "state bucket", "state push", "state pull",
    "unlock",
    "access grant", "access revoke", "access list", "slurm account add", "slurm account list",
]

COMMANDS: Final[Mapping[Command, str]] = MappingProxyType({
    "up": "gpuprov.core.up",
    "down": "gpuprov.core.down",
    "list": "gpuprov.core.status",
    "status": "gpuprov.core.status",
    "inventory": "gpuprov.core.status",
    "settings": "gpuprov.core.status",
    "provision": "gpuprov.core.provision",
    "verify": "gpuprov.core.verify",
    "verify --local": "gpuprov.core.local",
    "exec": "gpuprov.core.remote",
    "ssh": "gpuprov.core.login",
    "ssh-config": "gpuprov.core.login",
    "image bake": "gpuprov.core.baking",
    "image list": "gpuprov.core.baking",
    "image delete": "gpuprov.core.baking",
    "monitor": "gpuprov.core.monitoring",
    "patch": "gpuprov.core.patch",
    "patch --onto-image": "gpuprov.core.onto_image",
    "power-service": "gpuprov.core.power_service",
    "usage": "gpuprov.core.usage",
    "settings --set": "gpuprov.core.team_state",  # without NAME: --set state=..., this machine's state
    "state bucket": "gpuprov.core.team_state",
    "state push": "gpuprov.core.team_state",
    "state pull": "gpuprov.core.team_state",
    "unlock": "gpuprov.core.team_state",
    "access grant": "gpuprov.core.access",
    "access revoke": "gpuprov.core.access",
    "access list": "gpuprov.core.access",
    "slurm account add": "gpuprov.core.slurm_accounts",
    "slurm account list": "gpuprov.core.slurm_accounts",
})


def core(command: Command) -> ModuleType:
    """The module of gpuprov/core/ that ``command`` runs, imported now if it is not yet."""
    return importlib.import_module(COMMANDS[command])
