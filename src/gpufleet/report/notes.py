"""Notes said once: a note that differs only in its figures over repeats and levels (a late
client's timers at every level of a sweep) is one line naming the levels and the range of
its figures, so the answer and its table stay on the first screen."""

from __future__ import annotations

import re

# a figure, or a range of figures as said_once writes one (`3.1-7.2`)
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?")


def said_once(notes: list[tuple[int, str]]) -> list[tuple[str, str]]:
    """Notes that differ only in their figures, said once: (`1,4,16`, the text with each
    figure that varied given as its range `3.1-7.2`), in the order first said. A late
    client's note over three repeats of six levels is one line, not eighteen."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for c, text in notes:
        groups.setdefault(_NUMBER.sub("\0", text), []).append((c, text))
    out = []
    for template, said in groups.items():
        columns = zip(*(_NUMBER.findall(text) for _, text in said), strict=True)
        pieces = template.split("\0")
        ranges = [_range(list(column)) for column in columns] + [""]
        text = "".join(piece + figure for piece, figure in zip(pieces, ranges, strict=True))
        out.append((",".join(str(c) for c in dict.fromkeys(sorted(c for c, _ in said))), text))
    return out


def _range(found: list[str]) -> str:
    """`7.2` where every note said it, else `3.1-7.2` (as they were printed); ranges
    already said (a level's repeats) widen it."""
    ends = [end for figure in found for end in figure.split("-")]
    low, high = min(ends, key=float), max(ends, key=float)
    return low if float(low) == float(high) else f"{low}-{high}"
