"""Markdown tables, written one way: every table gpufleet writes in Markdown (a run's
summary.md, a comparison's summary.md, `inv compare --format md`) goes through
`md_table`, so a cell that holds a `|` or a line break (a profile label, an error text)
cannot split a row into more columns than its header (a renderer then draws no table)."""

from __future__ import annotations


def md_cell(text: object) -> str:
    """One cell: pipes escaped, line breaks as spaces."""
    return " ".join(str(text).splitlines()).replace("|", "\\|")


def md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The table's lines: header, separator, rows, each with len(headers) cells."""
    lines = ["| " + " | ".join(md_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a table row has {len(row)} cells, its header {len(headers)}")
        lines.append("| " + " | ".join(md_cell(c) for c in row) + " |")
    return lines
