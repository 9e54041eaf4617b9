"""One form for each unit and for time (issue 53, section 7): a memlock limit in MiB with its bytes
wherever a node's answer is shown (`ulimit -l` counts KiB, /proc/PID/limits bytes), image sizes
in GiB as volume sizes are, and every timestamp gpuprov writes in RFC 3339 UTC with ``Z``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from gpuprov.clock import utc_text
from gpuprov.node_text import memlock_text

ROOT = Path(__file__).resolve().parents[2]


def test_memlock_is_mib_with_its_bytes_whatever_unit_the_node_counts_in() -> None:
    assert memlock_text("8388608", 1) == memlock_text("8192", 1024) == "8 MiB (8388608 bytes)"
    assert memlock_text("9437184", 1) == "9 MiB (9437184 bytes)"
    assert memlock_text("12582912", 1) == "12 MiB (12582912 bytes)"
    assert memlock_text("1572864", 1) == "1.5 MiB (1572864 bytes)"
    assert memlock_text("64", 1024) == "65536 bytes"
    assert memlock_text("unlimited", 1) == "unlimited"
    assert memlock_text("x\x1b[2J", 1) == "x?[2J"  # a node's text, printable


def test_a_timestamp_is_utc_to_the_second_with_z() -> None:
    at = datetime(2026, 12, 2, 8, 40, 17, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert utc_text(at) == "2026-12-02T06:40:17Z"
    assert utc_text(datetime(2026, 12, 2, 6, 40, 17)) == "2026-12-02T06:40:17Z"  # naive: UTC
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", utc_text())
    assert datetime.fromisoformat(utc_text(at)) == at.replace(microsecond=0).astimezone(UTC)


def test_gpuprov_writes_no_timestamp_of_another_form() -> None:
    """No module turns a time into text itself (``isoformat()``, a strftime of a date and time),
    but the run directories' names (microseconds, no separators: a file name, not a time shown)."""
    found = []
    for path in sorted((ROOT / "gpuprov").rglob("*.py")):
        if path.name == "clock.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\.isoformat\(\)|strftime\(\"%Y-%m-%dT", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
