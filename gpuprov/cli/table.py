"""Tables for people, as wide as the output (rich loads on first use).

A terminal's width is rich's (the terminal, or COLUMNS); piped output honours COLUMNS, else
100 columns. No cell is ever cut. The first column (the row's key: a node, a type, a setting)
never wraps; the words of the columns a table names in ``keep`` (ids, addresses, paths, URLs:
what a user copies) stay whole on one line; the others wrap between words, and a word of
FOLD_FROM characters or more folds. Where that is still too wide, the table is wider than the
output. A title is a line of its own, never wrapped. The columns named ``under`` (a type's
`why`, a probe's detail, a run's artifacts) stay in the table when every row then fits on one
line, and otherwise go under their row, a line each.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

PIPED_WIDTH = 100  # piped, without COLUMNS
FOLD_FROM = 32  # a word this long or longer in a column that wraps may fold (a digest, a long path)


def width() -> int | None:
    """The output's width: None on a terminal (rich reads it, or COLUMNS), else COLUMNS, else 100."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


def table(title: str | None, columns: list[str], rows: list[list[Any]], *, keep: Sequence[str] = (),
          under: Sequence[str] = ()) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=False, width=width())
    cells = [["" if v is None else str(v) for v in row] for row in rows]
    if title is not None:  # one line, never wrapped (grep finds it whole); text, never markup
        console.print(Text(title), no_wrap=True, crop=False, overflow="ignore")
    moved = [i for i, col in enumerate(columns) if col in under]
    if moved and sum(_natural(columns, cells)) + 3 * len(columns) + 1 > console.width:
        stay = [i for i in range(len(columns)) if i not in moved]
        _print_with_notes_under(console, [columns[i] for i in stay], [[row[i] for i in stay] for row in cells], keep,
                                [[(columns[i], row[i]) for i in moved] for row in cells])
        return
    widths = _widths(columns, cells, keep, console.width - 3 * len(columns) - 1)
    _print(console, _build(columns, cells, widths), sum(widths) + 3 * len(columns) + 1)


def _natural(columns: list[str], cells: list[list[str]]) -> list[int]:
    """Each column's width with every cell on one line."""
    from rich.cells import cell_len

    return [max(cell_len(line) for text in [col, *(row[i] for row in cells)] for line in text.split("\n"))
            for i, col in enumerate(columns)]


def _widths(columns: list[str], cells: list[list[str]], keep: Sequence[str], room: int) -> list[int]:
    """Each column's width in ``room``: the first whole; the others, widest first, down to their
    longest word (up to FOLD_FROM, and whole in ``keep``). Where even that is too wide, the table
    is wider."""
    from rich.cells import cell_len

    natural = _natural(columns, cells)
    least = [n if i == 0 else min(max([cell_len(w) for text in [col, *(row[i] for row in cells)]
                                       for w in text.split()] or [1]), n if col in keep else FOLD_FROM, n)
             for i, (col, n) in enumerate(zip(columns, natural, strict=True))]

    def capped(cap: int) -> list[int]:
        return [max(low, min(n, cap)) for n, low in zip(natural, least, strict=True)]

    cap = max(natural)
    while cap > 1 and sum(capped(cap)) > room:
        cap -= 1
    return capped(cap)


def _build(columns: list[str], cells: list[list[str]], widths: list[int], **options: Any) -> Any:
    from rich.table import Table
    from rich.text import Text

    out = Table(**options)
    for col, size in zip(columns, widths, strict=True):
        out.add_column(col, width=size, overflow="fold")
    for row in cells:
        out.add_row(*[Text(v) for v in row])  # cells carry what nodes said: text, never markup
    return out


def _print(console: Any, renderable: Any, least: int) -> None:
    """``renderable`` at the console's width, or wider where what is never cut needs it."""
    from rich.text import Text

    for line in console.render_lines(renderable, console.options.update_width(max(console.width, least)), pad=False):
        _print_line(console, line, Text)


def _print_with_notes_under(console: Any, columns: list[str], cells: list[list[str]], keep: Sequence[str],
                            notes: list[list[tuple[str, str]]]) -> None:
    """The table without the columns of ``notes``; each row's values of them under the row, a line
    each (`    why: ...`), an empty one left out.
    Rows are told apart by the blank line rich draws between them (cells hold no blank line)."""
    from rich import box
    from rich.padding import Padding
    from rich.text import Text

    cells = [[_no_blank_lines(v) for v in row] for row in cells]
    widths = _widths(columns, cells, keep, console.width - 2 * len(columns))
    grid = _build(columns, cells, widths, box=box.SIMPLE_HEAD, show_edge=False, show_lines=True,
                  padding=(0, 1, 0, 0), pad_edge=False)
    options = console.options.update_width(max(console.width, sum(widths) + 2 * len(columns)))
    lines = console.render_lines(grid, options, pad=False)
    head = next(i for i, line in enumerate(lines) if "─" in "".join(s.text for s in line)) + 1
    starts = [head] + [i + 1 for i in range(head, len(lines)) if not "".join(s.text for s in lines[i]).strip()]
    for line in lines[:head]:
        _print_line(console, line, Text)
    for n, start in enumerate(starts):
        end = starts[n + 1] - 1 if n + 1 < len(starts) else len(lines)
        for line in lines[start:end]:
            _print_line(console, line, Text)
        for col, value in notes[n]:
            if value and col in keep:  # a path: on one line, whole
                console.print(Text(f"    {col}: {value}"), no_wrap=True, crop=False, overflow="ignore")
            elif value:
                _say(console, Padding(Text(f"{col}: {value}"), (0, 0, 0, 4), expand=False))


def _say(console: Any, renderable: Any) -> None:
    """``renderable`` wrapped at the console's width, each line without trailing spaces."""
    from rich.text import Text

    for line in console.render_lines(renderable, console.options, pad=False):
        _print_line(console, line, Text)


def _print_line(console: Any, line: list[Any], text: Any) -> None:
    out = text.assemble(*[(s.text, s.style) for s in line if not s.control])
    out.rstrip()
    console.print(out, no_wrap=True, crop=False, overflow="ignore")


def _no_blank_lines(value: str) -> str:
    return "\n".join(line for line in value.split("\n") if line.strip()) if "\n" in value else value
