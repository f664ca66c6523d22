"""Slurm's host list syntax (`gpu[01-16,20]`, `rack[1-2]-n[1-4]`, `a1,b[2-3]`), expanded the
way `scontrol show hostnames` does: ranges keep their zero padding, several bracket groups
multiply, commas outside brackets separate lists. Works without Slurm; what Slurm itself
says of a job, a partition or a node is asked in control/inventory/slurm.py.
"""

from __future__ import annotations

import re

from gpufleet.errors import UserError

MAX_HOSTS = 100_000  # a typo such as gpu[1-9999999] is refused, not expanded
MAX_TEXT = 1 << 20  # characters of one host list
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_BRACKETS = re.compile(r"(\[[^\[\]]*\])")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _split_top(text: str) -> list[str]:
    """Split at commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise UserError(f"host list {text[:80]!r}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"host list {text[:80]!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise UserError(f"host list {text[:80]!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _ranges(body: str, whole: str) -> list[tuple[int, int, int]]:
    """A bracket's ranges as (low, high, zero-pad width), checked, nothing expanded."""
    out = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise UserError(
                f"host list {whole!r}: {item!r} in [{body}] is not a number or a range "
                "such as 01-16"
            )
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        if len(low_text) > 9 or len(high_text) > 9:
            raise UserError(f"host list {whole!r}: {item} is over {MAX_HOSTS} hosts")
        low, high = int(low_text), int(high_text)
        if high < low:
            raise UserError(f"host list {whole!r}: range {item} goes down")
        width = len(low_text) if low_text.startswith("0") and len(low_text) > 1 else 0
        out.append((low, high, width))
    return out


def _pieces(pattern: str, whole: str) -> tuple[list[str | list[tuple[int, int, int]]], int]:
    """A pattern's literal and bracket pieces, and how many names it makes (computed,
    not built: `n[0-9999]x[0-9999]` is refused before a single name exists)."""
    pieces: list[str | list[tuple[int, int, int]]] = []
    size = 1
    for piece in _BRACKETS.split(pattern):
        if piece.startswith("["):
            ranges = _ranges(piece[1:-1], whole)
            size *= sum(high - low + 1 for low, high, _ in ranges)
            pieces.append(ranges)
        elif piece:
            pieces.append(piece)
        if size > MAX_HOSTS:
            raise UserError(f"host list {whole!r}: over {MAX_HOSTS} hosts")
    return pieces, size


def _expand_one(pieces: list[str | list[tuple[int, int, int]]]) -> list[str]:
    names = [""]
    for piece in pieces:
        if isinstance(piece, str):
            names = [n + piece for n in names]
            continue
        values = [str(v).zfill(w) for low, high, w in piece for v in range(low, high + 1)]
        names = [n + v for n in names for v in values]
    return names


def expand(text: str) -> list[str]:
    """Every host name of a Slurm host list, in order, duplicates dropped.

    The cap is on the whole list (every comma part counted before any is built), and
    de-duplication is by set, so time and memory grow linearly with the hosts listed.
    """
    text = text.strip()
    if not text:
        raise UserError("host list is empty")
    if len(text) > MAX_TEXT:
        raise UserError(f"host list of {len(text)} characters: over {MAX_TEXT}")
    parts, total = [], 0
    for part in _split_top(text):
        part = part.strip()
        if not part:
            raise UserError(f"host list {text[:80]!r}: empty name between commas")
        pieces, size = _pieces(part, text[:80])
        total += size
        if total > MAX_HOSTS:
            raise UserError(f"host list {text[:80]!r}: over {MAX_HOSTS} hosts in all")
        parts.append(pieces)
    seen: dict[str, None] = {}
    for pieces in parts:
        for name in _expand_one(pieces):
            if not _NAME.match(name):
                raise UserError(f"host list {text[:80]!r}: {name!r} is not a host name")
            seen[name] = None
    return list(seen)
