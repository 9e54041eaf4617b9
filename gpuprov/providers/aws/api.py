"""boto3 plumbing for the aws provider: session, clients, errors, retries.

boto3 and botocore are imported here, lazily, and nowhere else in gpuprov.
The endpoint and credentials come from boto3's standard chain
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...): nothing here names an endpoint.
The region: ``--region``, else what botocore reads (``AWS_DEFAULT_REGION``,
else the profile's ``region`` in the config file), with ``AWS_REGION`` read
by gpuprov itself before the config file, because botocore ignores it (see
``resolve_region``).

An endpoint that cannot be reached (no network, a wrong ``AWS_ENDPOINT_URL``)
is one line naming the endpoint, from every client this module makes: see
``Unreachable``.

A configuration that cannot be used (``AWS_PROFILE`` naming a profile that is not
there, a config or credentials file that does not parse, an unknown region in the
profile) is bad input, found by ``connect`` before any API call: one line naming the
profile, the file and line, or the region, exit 2 (``ConfigError``).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuprov.errors import BadInput, GpuprovError
from gpuprov.pricing.regions import FALLBACK_REGION

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

# botocore's names the other modules use, imported on first use (`except api.ClientError:`
# evaluates the name only when an exception reaches it): this module is the one that imports
# boto3 and botocore (tests/unit/test_aws_adaptor.py holds it).
_BOTOCORE = {"ClientError": "exceptions", "BotoCoreError": "exceptions", "Config": "config"}


def __getattr__(name: str) -> Any:
    if name in _BOTOCORE:
        import importlib

        return getattr(importlib.import_module(f"botocore.{_BOTOCORE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def error_message(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Message", "")) or str(exc)


def is_client_error(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError

    return isinstance(exc, ClientError)


class Unreachable(GpuprovError):
    """The AWS endpoint did not answer at all (connection refused, DNS, timeout), after
    botocore's retries. Raised from inside every client call (paginators included)."""


def _unreachable_hook(service: str, endpoint: str) -> Any:
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ReadTimeoutError

    def handler(exception: BaseException | None = None, **_: Any) -> None:
        if isinstance(exception, (BotoConnectionError, ReadTimeoutError)):
            reason = str(exception).splitlines()[0] if str(exception) else type(exception).__name__
            raise Unreachable(
                f"cannot reach the AWS {service} endpoint {endpoint} ({type(exception).__name__}: {reason}); "
                "check the network, AWS_ENDPOINT_URL and --region"
            )

    return handler


# botocore 1.44 (configprovider.py, BOTOCORE_DEFAUT_SESSION_VARIABLES) reads the region
# from AWS_DEFAULT_REGION, then the profile's `region` in the config file. It does not
# read AWS_REGION (only its "smart defaults" look at it, inside AWS_EXECUTION_ENV), which
# the AWS CLI v2 and the other SDKs do read; gpuprov reads it itself.
REGION_VARIABLES = ("AWS_DEFAULT_REGION", "AWS_REGION")


def resolve_region(region: str | None, session: Any) -> tuple[str | None, str]:
    """(region, where it came from): --region, AWS_DEFAULT_REGION, AWS_REGION, the profile."""
    if region:
        return region, "--region"
    for variable in REGION_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            return value, variable
    found = session.region_name or None
    if found:
        return found, f"profile '{session.profile_name or 'default'}' in {config_files()[0]}"
    return None, "the AWS config file"


def configured() -> bool:
    """Cheap hint that the user has AWS set up here (no network, no metadata service)."""
    if any(os.environ.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_ENDPOINT_URL")):
        return True
    return any(path.is_file() for path in config_files())


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
            client = self.session.client(
                service,
                region_name=self.region,
                config=Config(
                    retries={"mode": "adaptive", "max_attempts": self.attempts},
                    connect_timeout=10,
                    read_timeout=60,
                    user_agent_extra="gpuprov",
                ),
            )
            client.meta.events.register("after-call-error", _unreachable_hook(service, client.meta.endpoint_url))
            cache[service] = client
        return cache[service]

    @property
    def ec2(self) -> Any:
        return self.client("ec2")

    def identity(self) -> dict[str, str]:
        """These credentials' account and principal (STS GetCallerIdentity, which needs no
        permission), asked once per command and kept: the account is the owner every S3 call
        expects (s3.py), the principal what IAM's policy simulator is asked about."""
        cache: dict[str, str] = self.__dict__.setdefault("_identity", {})
        if not cache:
            answer = self.client("sts").get_caller_identity()
            cache.update(account=str(answer["Account"]), arn=str(answer["Arn"]))
        return cache

    @property
    def account(self) -> str:
        return self.identity()["account"]


class ConfigError(BadInput):
    """The AWS configuration here cannot be used (a profile that is not there, a config or
    credentials file that does not parse): bad input, found before any API call (exit 2)."""


def config_files() -> tuple[Path, Path]:
    """The AWS config and shared credentials files botocore reads."""
    config = Path(os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config").expanduser()
    creds = Path(os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials").expanduser()
    return config, creds


def _profiles() -> list[str]:
    """The profile names the config and credentials files define (unreadable files: none)."""
    import configparser

    config, creds = config_files()
    names: list[str] = []
    for path, prefix in ((config, "profile "), (creds, "")):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        for section in parser.sections():
            name = section[len(prefix):].strip() if prefix and section.startswith(prefix) else section
            if name not in names:
                names.append(name)
    return names


def _parse_problem(path: Path) -> str:
    """Where an INI file stops parsing: the line number only (a line of the credentials file
    may hold a secret, so its text is never quoted)."""
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except configparser.MissingSectionHeaderError as exc:
        return f"line {exc.lineno} comes before any [section] line"
    except configparser.ParsingError as exc:
        lines = ", ".join(str(number) for number, _ in exc.errors[:5])
        return f"line {lines}: neither a [section] nor a key = value line"
    except configparser.DuplicateSectionError as exc:
        return f"section [{exc.section}] appears twice (line {exc.lineno})"
    except configparser.DuplicateOptionError as exc:
        return f"key {exc.option} appears twice in [{exc.section}] (line {exc.lineno})"
    except (configparser.Error, OSError, UnicodeDecodeError) as exc:
        return type(exc).__name__
    return "not INI"


def _profile_origin(profile: str) -> str:
    for variable in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        if os.environ.get(variable) == profile:
            return variable
    return "the source_profile of another profile"


def config_error(exc: BaseException) -> ConfigError | None:
    """The one line for a botocore configuration error (None: not one of those)."""
    from botocore import exceptions as boto

    config, creds = config_files()
    if isinstance(exc, boto.ProfileNotFound):
        profile = getattr(exc, "kwargs", {}).get("profile", "?")
        known = _profiles()
        have = f"profiles there: {', '.join(known[:10])}" if known else "no profile is defined there"
        return ConfigError(
            f"AWS profile '{profile}' (from {_profile_origin(profile)}) is in neither {config} nor {creds} "
            f"({have}); set AWS_PROFILE to one of them, or unset it"
        )
    if isinstance(exc, boto.ConfigParseError):
        path = getattr(exc, "kwargs", {}).get("path", config)
        kind = "credentials" if Path(path).expanduser() == creds else "config"
        return ConfigError(
            f"AWS {kind} file {path} does not parse ({_parse_problem(Path(path))}); fix it, "
            "or point AWS_CONFIG_FILE / AWS_SHARED_CREDENTIALS_FILE at another file"
        )
    if isinstance(exc, (boto.ConfigNotFound, boto.InvalidConfigError, boto.PartialCredentialsError,
                        boto.InvalidRegionError, boto.UnknownCredentialError)):
        reason = " ".join(str(exc).split())
        return ConfigError(f"AWS configuration ({config}, {creds}) cannot be used: {reason}")
    return None


def connect(region: str | None, *, need_credentials: bool = True, attempts: int = MAX_ATTEMPTS) -> Aws:
    """A session for ``region`` (else the configured default). Checks, without any API
    call, that the profile and the config files are usable, that the region exists and
    that credentials are there: BadInput (ConfigError) otherwise."""
    return _configured(lambda: _connect(region, need_credentials=need_credentials, attempts=attempts))


def without_credentials(region: str | None) -> tuple[str, str] | None:
    """Where boto3 finds no credentials here: (the region a plan made without AWS is priced in,
    where it came from): --region, AWS_DEFAULT_REGION, AWS_REGION, the profile's, else us-east-1
    as `gpuprov types` takes it. None where credentials are found (AWS is asked then). No API
    call; the config's faults are ConfigError, as ``connect`` says them."""
    return _configured(lambda: _unconfigured_region(region))


def _configured(read: Any) -> Any:
    """``read()``, a botocore configuration error in it turned into its one line (ConfigError)."""
    from botocore.exceptions import BotoCoreError

    try:
        return read()
    except BotoCoreError as exc:
        error = config_error(exc)
        if error is None:
            raise
        raise error from None


def _unconfigured_region(region: str | None) -> tuple[str, str] | None:
    import boto3

    session = boto3.session.Session()
    if session.get_credentials() is not None:
        return None
    name, source = resolve_region(region, session)
    if not name:
        return FALLBACK_REGION, "the default"
    check_region(session, name, source)
    return name, source


def _connect(region: str | None, *, need_credentials: bool, attempts: int) -> Aws:
    import boto3

    session = boto3.session.Session()
    name, source = resolve_region(region, session)
    if not name:
        raise BadInput(
            "no AWS region: pass --region, or set AWS_DEFAULT_REGION (or AWS_REGION), "
            "or a region in the profile of ~/.aws/config"
        )
    check_region(session, name, source)
    if need_credentials and session.get_credentials() is None:
        raise BadInput(
            "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "or run `aws configure`"
        )
    return Aws(region=name, session=session, attempts=attempts)


def check_region(session: Any, name: str, source: str = "--region") -> None:
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(session.get_available_regions("ec2", partition_name=partition))
    if known and name not in known:
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        origin = "" if source == "--region" else f" (from {source})"
        raise BadInput(f"unknown AWS region '{name}'{origin}{hint}")


def call(fn: Any, what: str, **kwargs: Any) -> Any:
    """An API call whose failure is an operational error with AWS's reason, in one line."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(**kwargs)
    except Unreachable:
        raise
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
    except Unreachable:
        raise
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
