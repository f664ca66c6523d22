"""Markdown tables (report/markdown.py): every table gpufleet writes in Markdown has as many
cells in each row as in its header, whatever its cells hold."""

from __future__ import annotations

import random
import re

from gpufleet.report.markdown import md_table
from helpers import REPO


def _cells(line: str) -> int:
    """Cells of a GFM table row: split on pipes that are not escaped."""
    inner = line.strip()[1:-1]
    return len(re.split(r"(?<!\\)\|", inner))


def test_a_cell_with_pipes_or_line_breaks_keeps_its_row_in_shape():
    rng = random.Random(7)
    alphabet = ["a", "|", "\\", "\n", "\r\n", " ", "-", "`", "x|y", "||"]
    for _ in range(300):
        width = rng.randint(1, 8)
        headers = ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(width)]
        rows = [
            ["".join(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(width)]
            for _ in range(rng.randint(0, 4))
        ]
        lines = md_table(headers, rows)
        assert len(lines) == 2 + len(rows)  # no cell broke a line
        assert [_cells(line) for line in lines] == [width] * len(lines), lines


def test_markdown_tables_are_written_in_one_place():
    """A census of the source: a Markdown separator row is built only by md_table (the three
    writers each built their own, and none escaped a cell)."""
    built = [
        str(path.relative_to(REPO))
        for path in (REPO / "src" / "gpufleet").rglob("*.py")
        if '"---|"' in path.read_text() and path.name != "markdown.py"
    ]
    assert built == []
