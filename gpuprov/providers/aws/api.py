"""boto3 plumbing for the aws provider: session, clients, errors, retries.

boto3 and botocore are imported here, lazily, and nowhere else in gpuprov.
The endpoint, credentials and region come from boto3's standard chain
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_REGION``...): nothing here
names an endpoint.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.errors import BadInput, GpuprovError

# Throttling (RequestLimitExceeded) is retried by botocore's adaptive mode:
# exponential backoff with jitter plus a client-side rate limiter. It only
# surfaces once every attempt is spent.
MAX_ATTEMPTS = int(os.environ.get("GPUPROV_AWS_MAX_ATTEMPTS", "8"))

CAPACITY_ERRORS = frozenset(
    {"InsufficientInstanceCapacity", "InsufficientHostCapacity", "Unsupported", "InsufficientCapacity"}
)
QUOTA_ERRORS = frozenset(
    {"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow"}
)


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


def is_client_error(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


def configured() -> bool:
    """Cheap hint that the user has AWS set up here (no network, no metadata service)."""
    if any(os.environ.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ENDPOINT_URL")):
        return True
    home = Path(os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")).expanduser()
    creds = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser()
    return home.is_file() or creds.is_file()


@dataclass
class Aws:
    """One region's clients, built once per command."""

    region: str
    session: Any
    attempts: int = MAX_ATTEMPTS

    def client(self, service: str) -> Any:
        from botocore.config import Config

        cache = self.__dict__.setdefault("_clients", {})
        if service not in cache:
            cache[service] = self.session.client(
                service,
                region_name=self.region,
                config=Config(
                    retries={"mode": "adaptive", "max_attempts": self.attempts},
                    connect_timeout=10,
                    read_timeout=60,
                    user_agent_extra="gpuprov",
                ),
            )
        return cache[service]

    @property
    def ec2(self) -> Any:
        return self.client("ec2")


def connect(region: str | None, *, need_credentials: bool = True, attempts: int = MAX_ATTEMPTS) -> Aws:
    """A session for ``region`` (else the configured default). Checks, without any API
    call, that the region exists and that credentials are there: BadInput otherwise."""
    import boto3

    session = boto3.session.Session()
    name = region or session.region_name
    if not name:
        raise BadInput("no AWS region: pass --region or set AWS_REGION (or a region in ~/.aws/config)")
    check_region(session, name)
    if need_credentials and session.get_credentials() is None:
        raise BadInput(
            "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "or run `aws configure`"
        )
    return Aws(region=name, session=session, attempts=attempts)


def check_region(session: Any, name: str) -> None:
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if known and name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise BadInput(f"unknown AWS region '{name}'{hint}")


def call(fn: Any, what: str, **kwargs: Any) -> Any:
    """An API call whose failure is an operational error with AWS's reason, in one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**kwargs)
    except ClientError as exc:
        raise GpuprovError(f"{what} failed: {error_code(exc)}: {error_message(exc)}") from exc
    except BotoCoreError as exc:
        raise GpuprovError(f"{what} failed: {exc}") from exc


def dry_run(fn: Any, **kwargs: Any) -> tuple[bool | None, str]:
    """Ask EC2 whether a call would be allowed (DryRun=True).

    (True, "") allowed; (False, reason) refused for permissions; (None, reason)
    EC2 answered something else, so the permission is not known."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        fn(DryRun=True, **kwargs)
    except ClientError as exc:
        code = error_code(exc)
        if code == "DryRunOperation":
            return True, ""
        if code in ("UnauthorizedOperation", "AccessDenied", "AuthFailure"):
            return False, f"{code}: {error_message(exc)}"
        return None, f"{code}: {error_message(exc)}"
    except BotoCoreError as exc:
        return None, str(exc)
    return None, "EC2 ignored DryRun"
