"""One verdict per level of a comparison, from the same test that draws the interval: the
sentence's words (faster, slower, gains, loses, delivers) come from these, never from the
sign of two means that the interval calls the same.

With repeats a level's verdict is BETTER or WORSE where the 95% interval of B/A excludes
1.0, SAME where it includes it; with one run per arm there is no test (UNTESTED) and the
sentence says the direction of the means, which it marks as untested.
"""

from __future__ import annotations

from enum import StrEnum

from gpufleet.report.compare import Arm
from gpufleet.report.stats import ratio_ci


class Verdict(StrEnum):
    BETTER = "better"  # B better than A: the interval excludes 1.0 on B's side
    WORSE = "worse"
    SAME = "no difference measured"  # the interval includes 1.0
    UNTESTED = "too few repeats to tell"


def verdict(a: Arm, b: Arm, c: int, key: str, higher_is_better: bool = True) -> Verdict:
    """B against A on one figure at level `c`."""
    interval = ratio_ci(a.levels[c], b.levels[c], key)
    if interval is None:
        return Verdict.UNTESTED
    low, high = interval
    if low <= 1.0 <= high:
        return Verdict.SAME
    return Verdict.BETTER if (low > 1.0) == higher_is_better else Verdict.WORSE


def verdicts(a: Arm, b: Arm, levels: list[int], key: str, higher: bool = True) -> list[Verdict]:
    return [verdict(a, b, c, key, higher) for c in levels]


def tested(found: list[Verdict]) -> bool:
    """Repeats gave every level a test."""
    return bool(found) and Verdict.UNTESTED not in found


def levels_text(levels: list[int]) -> str:
    """`C=1,2,4` (or `C=8` for one)."""
    return "C=" + ",".join(str(c) for c in levels)


def by_verdict(levels: list[int], found: list[Verdict]) -> dict[Verdict, list[int]]:
    out: dict[Verdict, list[int]] = {}
    for c, v in zip(levels, found, strict=True):
        out.setdefault(v, []).append(c)
    return out
