"""Filters for the nvidia_driver role's apt preference (templates/gpuprov-nvidia-driver.pref.j2).

apt_preferences(5) allows one ``Pin:`` line per record and gives a package version the
priority of the first specific record that matches it. "This release, from this origin, and
no other" therefore takes three records, two of which match what is NOT something: the
versions that are not the lock's release, and the origins that are not the chosen source.
apt has no negation, but its ``Pin:`` values accept a POSIX extended regular expression
between slashes (apt-pkg/versionmatch.cc, ExpressionMatches: REG_EXTENDED | REG_ICASE), and
the complement of one string (or of one prefix) is a regular language: these filters write
it out.
"""

from __future__ import annotations

from urllib.parse import urlsplit

_ERE_SPECIAL = set(".[]()*+?{}|^$\\/")


class AptPinError(ValueError):
    """A value the preference cannot express."""


def _esc(text: str) -> str:
    return "".join("\\" + c if c in _ERE_SPECIAL else c for c in text)


def _not_char(c: str) -> str:
    # In a POSIX bracket expression backslash is literal; "]" must come first, "-" first or last.
    return f"[^{c}]" if c != "]" else "[^]]"


def _check(text: str, what: str) -> str:
    if not isinstance(text, str) or not text:
        raise AptPinError(f"{what}: expected a non-empty string, got {text!r}")
    if any(c in text for c in ",\n\r\t \"'"):
        raise AptPinError(f"{what} {text!r}: commas, quotes and whitespace cannot appear in an apt pin")
    return text


def apt_pin_not_string(text: str) -> str:
    """``/^(...)/``: matches every non-empty string except ``text`` (case-insensitively, as apt
    compares); for ``text`` "" every non-empty string. Never the empty string: the dpkg status file has no origin, and an installed
    version must not be matched by a never-pin just for being installed."""
    if text == "":
        # The chosen repository is a file: one (apt's origin ""): every named origin is another.
        return "/^./"
    text = _check(text, "origin")
    alts = [_esc(text[:i]) + _not_char(c) for i, c in enumerate(text)]
    alts += [_esc(text[:i]) + "$" for i in range(1, len(text))]
    alts.append(_esc(text) + ".")
    return "/^(" + "|".join(alts) + ")/"


def apt_pin_not_version(pattern: str) -> str:
    """``/^(...)/``: matches every version that apt's ``Pin: version PATTERN`` does not, for
    an exact version or a prefix with one trailing ``*`` (the lock's patterns: ``535.309.01-*``,
    ``11.8.89*``)."""
    pattern = _check(pattern, "version pattern")
    prefix = pattern[:-1] if pattern.endswith("*") else pattern
    if not prefix or any(c in prefix for c in "*?["):
        raise AptPinError(f"version pattern {pattern!r}: only an exact version or PREFIX* can be pinned")
    alts = [_esc(prefix[:i]) + _not_char(c) for i, c in enumerate(prefix)]
    alts += [_esc(prefix[:i]) + "$" for i in range(1, len(prefix))]
    if not pattern.endswith("*"):
        alts.append(_esc(prefix) + ".")
    return "/^(" + "|".join(alts) + ")/"


def apt_origin_host(url: str) -> str:
    """The host apt's ``Pin: origin`` compares with (the "origin" apt-cache policy prints for
    a repository): the URL's host name, without user, port or path; "" for file: and copy:."""
    if not isinstance(url, str) or not url.strip():
        raise AptPinError(f"repository URL: expected a URL, got {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme in ("file", "copy"):
        return ""
    if not parts.hostname:
        raise AptPinError(f"repository URL {url!r} names no host")
    return parts.hostname


class FilterModule:
    def filters(self):
        return {
            "apt_pin_not_string": apt_pin_not_string,
            "apt_pin_not_version": apt_pin_not_version,
            "apt_origin_host": apt_origin_host,
        }
