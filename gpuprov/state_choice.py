"""Which state store a command uses: this machine's SQLite file (the default), or a prefix of an
S3 bucket a team shares (docs/team-state.md).

``GPUPROV_STATE``, else ``state`` in the settings file (`gpuprov settings --set
state=s3://BUCKET/PREFIX` writes it there), names it: ``local`` or empty for the SQLite file,
``s3://BUCKET/PREFIX`` for the bucket. Read at each ``Store()`` (an environment variable and
a small file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuprov import validate
from gpuprov.errors import BadInput
from gpuprov.paths import machine_setting

ENV = "GPUPROV_STATE"
KEY = "state"  # its key in the settings file
# A prefix: S3 key characters that need no quoting anywhere, in '/'-separated parts.
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,64}(/[A-Za-z0-9._-]{1,64}){0,7}")


@dataclass(frozen=True)
class S3Location:
    bucket: str  # an existing bucket of this account (`gpuprov state bucket` makes one)
    prefix: str  # every key gpuprov writes there starts with it (ends with '/')

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix.rstrip('/')}"


def parse(value: str, where: str) -> S3Location | None:
    """``value`` as a state location: None for the local file, else the bucket and prefix. Bad
    input (one line naming ``where``) for anything else."""
    value = value.strip()
    if value in ("", "local"):
        return None
    if not value.startswith("s3://"):
        raise BadInput(f"{where} {value!r}: expected local or s3://BUCKET/PREFIX")
    bucket, _, prefix = value[len("s3://"):].partition("/")
    validate.s3_bucket_name(bucket, f"{where}: the bucket")
    prefix = prefix.strip("/")
    if not _PREFIX.fullmatch(prefix) or any(part in (".", "..") for part in prefix.split("/")):
        raise BadInput(f"{where} {value!r}: the prefix must be 1 to 8 '/'-separated parts of letters, digits, "
                       "'.', '_' and '-' (not . or ..), as in s3://team-gpu-state/fleet")
    return S3Location(bucket=bucket, prefix=prefix + "/")


def chosen() -> S3Location | None:
    """The state this process uses: GPUPROV_STATE, else the settings file's, else local."""
    return parse(*machine_setting(KEY, ENV))
