"""Timestamps in one form everywhere gpuprov writes one (state, JSON, tables, tags, file names
aside): RFC 3339 in UTC to the second, with ``Z`` (``2026-12-02T06:40:17Z``)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_text(at: datetime | None = None) -> str:
    """``at`` (now when None; a naive time is taken as UTC) as ``YYYY-MM-DDTHH:MM:SSZ``."""
    at = datetime.now(UTC) if at is None else at if at.tzinfo else at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
