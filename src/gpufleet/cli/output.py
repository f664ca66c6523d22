"""Tables for people: rich on a terminal, plain aligned text when piped (tests, logs, CI)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO


def _plain(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [title] if title else []
    for i, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    stream: TextIO | None = None,
) -> None:
    stream = stream or sys.stdout
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title or None, title_justify="left")
        for h in headers:
            t.add_column(str(h))
        for row in rows:
            t.add_row(*(str(c) for c in row))
        Console(file=stream).print(t)
    else:
        print(_plain(title, headers, rows), file=stream)


def line(text: str, stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)
