"""Checks for every string that comes from a user or a file before it reaches ssh, Ansible or apt.

Each function returns the value it was given (normalised where said) or raises
``BadInput`` with one line that names the value and what is allowed. Matching is
always whole-string (``re.fullmatch``): ``$`` would let a trailing newline through.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from gpuprov.errors import BadInput

CLUSTER_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}[a-z0-9]")
# Inventory host names: what Ansible accepts as a host pattern, nothing that could be syntax.
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# POSIX portable user names (IEEE Std 1003.1, 3.437), not starting with '-'; at most 32 (useradd).
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# A DNS name: labels of letters, digits and '-', not starting or ending with '-' (RFC 1123).
DNS_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
INSTANCE_TYPE = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
FINGERPRINT = re.compile(r"[0-9A-F]{40}")
DRIVER = re.compile(r"[0-9]{3}(?:\.[0-9]{1,3}){0,2}")
CUDA = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
TAG = re.compile(r"[a-z][a-z0-9_]{0,40}")
# A content digest as registries name an image: sha256 and 64 lowercase hex digits, nothing else.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# An image reference without its digest: [host[:port]/]path[:tag] (the distribution spec's
# characters); no template, space or quote can be in one.
IMAGE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?(?::[0-9]{1,5})?(?:/[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)*"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?")
# What a URL gpuprov hands a play never holds: a template's braces, a percent sign (Jinja's
# statements, and an escape that could hide any character), a fragment or a comment.
URL_REFUSED = "{}%#"
# An IPv6 zone id (fe80::1%eth0): an interface name or number. ipaddress takes anything after
# the '%' but '/' and '%', a newline and a space included.
ZONE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# What ends a line for some reader of a line-based file: C0 controls (newline, carriage return,
# tab, NUL...), DEL, C1 controls (NEL) and Unicode's line and paragraph separators.
LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# What one word of an OpenSSH option may hold, on ssh's command line (-o KEY=VALUE) and in
# ~/.ssh/config alike (ssh_config_word).
SSH_WORD = re.compile(r"[A-Za-z0-9_./:@+-]+")


def cluster_name(name: str) -> str:
    if not isinstance(name, str) or not CLUSTER_NAME.fullmatch(name):
        raise BadInput(
            f"invalid cluster name {name!r}: use 2-32 characters, lowercase letters, digits "
            "and '-', starting with a letter"
        )
    return name


def host_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not HOST_NAME.fullmatch(value):
        raise BadInput(f"{where}: invalid host name {value!r} (letters, digits, '.', '_', '-')")
    return value


def user_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not USER_NAME.fullmatch(value):
        raise BadInput(
            f"{where}: invalid user {value!r} (a POSIX user name: letters, digits, '_', '.', '-', "
            "not starting with '-')"
        )
    return value


def address(value: Any, where: str) -> str:
    """An IPv4 or IPv6 address, or a DNS name; nothing else (no options, no spaces, no ports)."""
    if not isinstance(value, str) or not value:
        raise BadInput(f"{where}: invalid address {value!r} (an IP address or a DNS name)")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None:
        zone = getattr(ip, "scope_id", None)
        if zone is not None and not ZONE_ID.fullmatch(zone):
            raise BadInput(f"{where}: invalid address {value!r} (an IPv6 zone id is an interface: "
                           "letters, digits, '_', '.', '-')")
        return str(ip)
    name = value[:-1] if value.endswith(".") else value
    labels = name.split(".")
    if len(name) > 253 or not all(DNS_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise BadInput(f"{where}: invalid address {value!r} (an IP address or a DNS name)")
    return value


def port(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadInput(f"{where}: port must be a whole number, not {value!r}")
    text = str(value).strip()
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise BadInput(f"{where}: port {value!r} is not a number from 1 to 65535")
    return int(text)


def count(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadInput(f"{where}: expected a whole number, not {value!r}")
    text = str(value).strip()
    if not text.isdigit() or int(text) < minimum:
        raise BadInput(f"{where}: expected a whole number of at least {minimum}, not {value!r}")
    return int(text)


def flag(value: Any, where: str) -> bool:
    """true or false: YAML's booleans, or the words an INI inventory gives as text."""
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("true", "yes"):
        return True
    if word in ("false", "no"):
        return False
    raise BadInput(f"{where}: expected true or false, not {value!r}")


def text(value: Any, where: str) -> str:
    """A plain one-line string (numbers, lists and maps are refused: they are not what was meant)."""
    if not isinstance(value, str) or not value or any(c in value for c in "\n\r\0"):
        raise BadInput(f"{where}: expected a one-line string, not {value!r}")
    return value


def one_line(value: Any, where: str) -> Any:
    """What every writer of a line-based file (known_hosts, an inventory, extra variables) says
    last of each value it writes, whatever checked it before: a string with a control character
    (a newline, a carriage return, a tab, NUL, NEL, a line separator) is refused. Lists, tuples
    and mappings are walked (keys too); other values are returned as given."""
    if isinstance(value, str):
        if LINE_BREAKING.search(value):
            raise BadInput(f"{where}: {value!r} holds a control character (a newline or the like); "
                           "refused, it would end a line of the file written")
    elif isinstance(value, dict):
        for key, item in value.items():
            one_line(key, where)
            one_line(item, f"{where}: {key}")
    elif isinstance(value, list | tuple):
        for item in value:
            one_line(item, where)
    return value


def ssh_config_word(value: Any, where: str) -> str:
    """A value OpenSSH reads as one plain word: letters, digits and ``_ . / : @ + -`` only.

    ssh_config(5) and ssh's ``-o`` read a value as config text: whitespace and ``=`` separate
    words (``IdentityFile /a b`` names two files, ``UserKnownHostsFile`` several), a quote
    starts a quoted word, ``#`` a comment, a control character ends the line (and may start a
    new option there), and ``%`` tokens, ``${VAR}`` and ``~`` are expanded in paths. A value
    holding any of them would add an option or a line, or read another file than the one
    named; quoting it would be a second syntax to get right, so it is refused instead."""
    if not isinstance(value, str) or not SSH_WORD.fullmatch(value):
        bad = next((c for c in value if not SSH_WORD.fullmatch(c)), "") if isinstance(value, str) and value else ""
        raise BadInput(f"{where}: {value!r} " + (f"holds {bad!r}" if bad else "is empty")
                       + ": ssh reads a value as config text, where only letters, digits and _ . / : @ + - "
                       "stand for themselves; refused, nothing printed or run")
    return value


def instance_type(value: Any, where: str) -> str:
    if not isinstance(value, str) or not INSTANCE_TYPE.fullmatch(value):
        raise BadInput(f"{where}: invalid instance type {value!r}")
    return value


def mirror_url(value: str, flag: str = "--mirror-url") -> str:
    """An http(s) URL with a host and nothing that could end a deb822 field or add one."""
    from urllib.parse import urlsplit

    if not isinstance(value, str) or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadInput(f"{flag} {value!r}: a URL has no spaces, tabs or newlines")
    if any(c in URL_REFUSED for c in value):
        raise BadInput(f"{flag} {value!r}: a mirror URL has no '{{', '}}', '%' or '#' "
                       "(a template, an escape or a fragment)")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"{flag} {value!r}: expected http:// or https:// and a host")
    if parts.username or parts.password:
        raise BadInput(f"{flag}: credentials in the URL would be written to the nodes' apt "
                       "sources; give the mirror access another way (apt auth.conf)")
    if parts.query or parts.fragment:
        raise BadInput(f"{flag} {value!r}: a repository URL has no query or fragment")
    return value


def key_fingerprint(value: str, flag: str = "--mirror-key-fingerprint") -> str:
    """An OpenPGP v4 fingerprint: 40 hex digits (spaces allowed between groups); upper-cased."""
    compact = value.replace(" ", "").upper() if isinstance(value, str) else ""
    if not FINGERPRINT.fullmatch(compact):
        raise BadInput(f"{flag} {value!r}: expected the key's full fingerprint, 40 hex digits")
    return compact


def digest(value: Any, where: str) -> str:
    """A registry digest: ``sha256:`` and exactly 64 lowercase hex digits."""
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise BadInput(f"{where}: invalid digest {value!r} (expected sha256: and 64 lowercase hex digits)")
    return value


def image_name(value: Any, where: str) -> str:
    """An image reference without a digest: [host[:port]/]path[:tag], lowercase path."""
    if not isinstance(value, str) or len(value) > 255 or not IMAGE_NAME.fullmatch(value):
        raise BadInput(f"{where}: invalid image name {value!r} ([host[:port]/]path[:tag])")
    return value


def driver(value: str) -> str:
    if not DRIVER.fullmatch(value):
        raise BadInput(f"--driver {value!r}: expected a branch (580) or a release (580.95.05)")
    return value


def cuda(value: str) -> str:
    if not CUDA.fullmatch(value):
        raise BadInput(f"--cuda {value!r}: expected a release like 11.8")
    return value


# S3's naming rules for general purpose buckets ("Bucket naming rules", Amazon S3 User Guide).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def s3_bucket_name(value: str, where: str) -> str:
    """An existing S3 bucket's name, by S3's rules; never one of the pattern of the buckets
    gpuprov makes per cluster (`down` of a cluster deletes a bucket of its pattern)."""
    why = ("3 to 63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"
           if not _BUCKET.fullmatch(value) else
           "no two adjacent periods" if ".." in value else
           "not formatted as an IP address" if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value) else
           f"no reserved prefix ({', '.join(_BUCKET_PREFIXES)})" if value.startswith(_BUCKET_PREFIXES) else
           f"no reserved suffix ({', '.join(_BUCKET_SUFFIXES)})" if value.endswith(_BUCKET_SUFFIXES) else
           "not of the pattern of the buckets gpuprov makes for a cluster (gpuprov-NAME-RANDOM)"
           if re.fullmatch(r"gpuprov-.+-[a-z0-9]{10}", value) else "")
    if why:
        raise BadInput(f"{where} {value!r} is not an S3 bucket name: {why}")
    return value
