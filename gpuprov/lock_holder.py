"""Who holds a cluster's lock, in words, and whether a holder's process lives: what the local
file lock and the S3 lease both say of their holder (gpuprov.state, gpuprov.state_s3)."""

from __future__ import annotations

import json
import os
from typing import Any


def holder_text(raw: bytes | dict[str, Any]) -> str:
    """Who holds a lock, from what the holder wrote: its command, pid and since when, and where
    a shared state has it, the operator, host and lease (a lock file of an older gpuprov holds
    the bare pid; one just taken may still be empty). Every value is printable, and short."""
    held: Any = raw
    if isinstance(raw, bytes):
        text = raw.decode(errors="replace").strip()
        try:
            held = json.loads(text)
        except ValueError:
            held = None
        if not isinstance(held, dict):
            held = {"pid": text} if text.isdigit() else {}

    def printable(value: object) -> str:
        return "".join(c if c.isprintable() else "?" for c in str(value))[:200]

    pid = held.get("pid")
    pid = printable(pid) if isinstance(pid, (int, str)) and str(pid).isdigit() else "?"
    words, since, by = held.get("command"), held.get("since"), held.get("by")
    who = (f"`{printable(' '.join(map(str, words)))}`" if isinstance(words, list) and words
           else "another gpuprov process")
    where = f"pid {pid}" + (f" of {printable(by)}" if isinstance(by, str) and by else "")
    until = held.get("until")
    lease = f", lease until {printable(until)}" if isinstance(until, str) and until else ""
    if isinstance(since, str) and since:
        return f"{who} ({where}) has held it since {printable(since)}{lease}"
    return f"{who} ({where}) is changing it{lease}"


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
