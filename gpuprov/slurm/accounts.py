"""A Slurm cluster's accounts and users (`gpuprov slurm account add|list`) and the export of its
accounting before `down --keep-accounting`: the words gpuprov runs on the controller, each one
fixed or a name checked here, and how their answers are read (docs/slurm.md, "Accounting").

Nothing of the user's or of a node's becomes shell: each command is argv words, quoted for the
node's shell by gpuprov.slurm.scheduler; an account or user name is lowercase letters, digits,
'_' and '-', starting with a letter, at most 32 characters, or it is refused (one line, exit 2)
before anything runs.
"""

from __future__ import annotations

import re

from gpuprov.errors import BadInput
from gpuprov.node_text import printable
from gpuprov.slurm.usage import SACCT_FIELDS

NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
NAME_RULE = "lowercase letters, digits, '_' and '-', starting with a letter, at most 32"
DATABASE = "slurm_acct_db"
# Every association (account, user) of the controller's Slurm; an account's own row has no user.
LIST_ASSOCIATIONS = ("sacctmgr", "-n", "-P", "list", "associations", "format=account,user")
# Every job Slurm recorded, one line each (its allocation), in the fields `gpuprov usage` reads,
# with sacct's header line; and the whole database, dumped by MariaDB's root over its unix socket
# (no password anywhere), in one transaction.
SACCT_ALL = ("sacct", "-a", "-P", "-X", "--starttime=1970-01-01", f"--format={','.join(SACCT_FIELDS)}")
MYSQLDUMP = ("sudo", "-n", "mysqldump", "--single-transaction", DATABASE)
SACCT_HEADER = "|".join(SACCT_FIELDS)


def check_name(text: str, what: str) -> str:
    """``text`` as an account or user name, or BadInput (one line, exit 2)."""
    if not NAME.fullmatch(text):
        raise BadInput(f"{what} {printable(text)[:40]!r}: not a Slurm {what.lstrip('-')} name ({NAME_RULE})")
    return text


def add_account(account: str) -> tuple[str, ...]:
    return ("sudo", "-n", "sacctmgr", "-i", "add", "account", check_name(account, "account"))


def add_user(user: str, account: str) -> tuple[str, ...]:
    return ("sudo", "-n", "sacctmgr", "-i", "add", "user", check_name(user, "--user"),
            f"Account={check_name(account, 'account')}")


def parse_associations(text: str) -> dict[str, list[str]]:
    """``LIST_ASSOCIATIONS``' answer as {account: its users, sorted} (an account with no user
    has none); a line that is no ``account|user`` of names is left out, never shown as it is."""
    out: dict[str, set[str]] = {}
    for line in printable(text, lines=True).splitlines():
        account, sep, user = line.strip().partition("|")
        if not sep or not NAME.fullmatch(account) or (user and not NAME.fullmatch(user)):
            continue
        out.setdefault(account, set()).update([user] if user else [])
    return {account: sorted(users) for account, users in sorted(out.items())}
