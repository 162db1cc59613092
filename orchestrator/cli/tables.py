"""Tables that never cut a value: a rich table when it fits the terminal, else plain aligned text.

Names, revisions and paths are what an operator copies into the next command; an ellipsis or a
column folded into one-word lines makes them useless. So a table is drawn with rich only on a
terminal wide enough for every cell in full; anywhere else (a narrow terminal, a pipe, a file) it
is printed as plain columns separated by two spaces, each row on one line, like ``docker ps``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

Cell = str | Text


def stdout_console() -> Console:
    """A console for stdout that hard-wraps prose only on a terminal (a pipe gets whole lines)."""
    console = Console(highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def print_table(
    console: Console,
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    title: str | None = None,
    notes: Sequence[str] = (),
) -> None:
    """Print rows under headers, whole; ``notes`` follow as numbered lines under the table.

    A cell is shown as given (no markup is interpreted); a Text cell keeps its style on a terminal.
    """
    table = Table(*headers, title=title)
    for col in table.columns:
        col.no_wrap = True
        col.overflow = "ignore"
    for row in rows:
        table.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in row))
    natural = console.measure(table, options=console.options.update_width(1_000_000)).maximum
    if console.is_terminal and natural <= console.width:
        console.print(table)
    else:
        _print_plain(console, headers, rows, title)
    if console.is_terminal and notes:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", no_wrap=True)
        grid.add_column()  # wrapped at word boundaries, under its own indent
        for number, note in enumerate(notes, 1):
            grid.add_row(f"{number}.", Text(note))
        console.print(grid)
    else:
        for number, note in enumerate(notes, 1):
            console.print(Text(f"{number:>3}. {note}"), soft_wrap=True)


def _print_plain(console: Console, headers: Sequence[str], rows: Sequence[Sequence[Cell]], title: str | None) -> None:
    plain = [[cell if isinstance(cell, str) else cell.plain for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in plain)]) for i, h in enumerate(headers)]
    if title:
        console.print(Text(title), soft_wrap=True)
    for cells in (list(headers), *plain):
        line = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        console.print(Text(line), soft_wrap=True)
