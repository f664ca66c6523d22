"""`--budget` as a limit (issue 83): the line that refuses a budget, before the first launch
where a pace is known, or stops the tune as soon as its measured pace says that what it
must still run (every depth asked for unless `--budget-may-drop depths`, and the
verification) cannot fit. The cells already run stay archived, so the next call starts
with their pace."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpufleet.errors import UserError


class BudgetStop(UserError):
    """What the tune must still run does not fit `--budget` (one line, exit 2)."""


@dataclass(frozen=True)
class Shortage:
    """Why a budget cannot hold the tune: the least it needs, at what pace, and the cheaper
    ways out (`with_drops_s`: the least with depths dropped, where the user did not allow
    that; `verify`: whether `--no-verify` would leave the verification out)."""

    budget_s: float
    least_s: float
    basis: str
    verify: bool
    with_drops_s: float | None = None
    launches: int = 0  # cells this call ran before it stopped (0: refused up front)
    spent_s: float = 0.0


def minutes(seconds: float) -> str:
    """Seconds as the tune says them: `95s` up to two minutes, `3.4 min` after."""
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.1f} min"


def line(s: Shortage) -> str:
    """The one line: what needs how long, the least budget that holds it, the ways out, and
    (after a stop) what was kept."""
    what = "the measurement and its verification" if s.verify else "the measurement"
    head = f"--budget {s.budget_s:g}: "
    if s.launches:
        head += (f"stopped after {s.launches} launch{'es' * (s.launches != 1)} "
                 f"({minutes(s.spent_s)} spent): ")  # fmt: skip
    text = (f"{head}{what} need ~{minutes(s.least_s)} in all at the pace of {s.basis}; "
            f"give --budget {math.ceil(s.least_s)} or more")  # fmt: skip
    if s.with_drops_s is not None and s.with_drops_s < s.least_s:
        text += (f", or --budget {math.ceil(s.with_drops_s)} with --budget-may-drop depths "
                 "(the deepest depths asked for left out)")  # fmt: skip
    if s.verify:
        text += ", or --no-verify to write the table unverified"
    if s.launches:
        text += "; the cells run are archived, so the next call has their pace"
    return text


def unpaced_line(budget_s: float, launches: int, spent_s: float) -> str:
    """The line for a budget spent before any cell finished (each failed): no pace to name
    a least budget by, so it says what happened and what to look at."""
    return (f"--budget {budget_s:g}: stopped after {launches} launch{'es' * (launches != 1)} "
            f"({minutes(spent_s)} spent): the budget is spent and no cell has finished to give "
            "a pace (each failed: see its error above)")  # fmt: skip
