"""Text from nodes, made safe for a terminal where it is first read.

What a node says (a pull agent's message, a task's name or result, a Slurm reason, ssh's
stderr, the health script's output) can hold escape sequences: ``ESC ] 52`` writes the
operator's clipboard, ``ESC [2J`` clears the screen, a bidi override reorders a line. Every
character that is not printable (ESC and the other C0 and C1 controls, DEL, the line and
paragraph separators, format characters) becomes ``?`` here, once, before anything shows it;
newlines and tabs stay only where a text is several lines (``lines=True``).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "?"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character a terminal could act on replaced by ``?`` (``lines``:
    newlines and tabs kept, a CRLF read as a newline)."""
    if text.isprintable():
        return text
    if lines:
        text = text.replace("\r\n", "\n")
        return "".join(c if c.isprintable() or c in "\n\t" else REPLACEMENT for c in text)
    return "".join(c if c.isprintable() else REPLACEMENT for c in text)


MAX_DEPTH = 64  # a node's answer nested deeper is cut there: its inner values become "?"


def printable_data(value: Any, depth: int = 0) -> Any:
    """A node's JSON-like answer with every string in it (keys too) made printable, several
    lines kept; numbers, flags and None as they are."""
    if isinstance(value, str):
        return printable(value, lines=True)
    if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
        return REPLACEMENT
    if isinstance(value, dict):
        return {printable(k, lines=True) if isinstance(k, str) else k: printable_data(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_data(v, depth + 1) for v in value]
    return value


def memlock_text(value: str, unit: int) -> str:
    """A memlock limit as a node gives it (``unit``: its bytes per count, 1 for /proc/PID/limits,
    1024 for `ulimit -l`), in one form everywhere: ``unlimited``, or MiB with the bytes
    (``8 MiB (8388608 bytes)``); anything else, printable, as it came."""
    if value == "unlimited":
        return value
    if not value.isdigit() or len(value) > 20:  # no count of a 64-bit limit: as it came
        return printable(value)
    size = int(value) * unit
    whole, rest = divmod(size, 2**20)
    if not whole:
        return f"{size} bytes"
    return f"{whole}{f'.{rest * 10 // 2**20}' if rest * 10 // 2**20 else ''} MiB ({size} bytes)"
