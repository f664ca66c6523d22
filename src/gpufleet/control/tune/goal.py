"""The tune's goal, and how a share of it is said: every sentence, table, record and
profile note of the tune prints a share through share_text, so none rounds a miss into a
pass (0.977 read "98%" against a 0.98 goal) and all of them agree."""

from __future__ import annotations

import math

GOAL = 0.98  # the tuned server keeps at least this of the best static at every level


def share_text(kept: float, goal: float = GOAL) -> str:
    """A share as a percentage at the precision that decides the goal: `98%` where it is
    plainly on its side, `97.7%` for 0.977 (never `98%`), `97.99%` for 0.9799; a figure
    printed is never on the other side of the goal from the figure measured."""
    for places in range(3):
        text = f"{kept * 100:.{places}f}"
        if (float(text) >= goal * 100) == (kept >= goal):
            return f"{text}%"
    return f"{math.floor(kept * 10000) / 100:.2f}%"  # just under the goal: rounded down


def goal_text(goal: float = GOAL) -> str:
    """The goal as the sentences name it ("the 98% goal"), in the shares' own unit."""
    return f"{goal * 100:g}%"
