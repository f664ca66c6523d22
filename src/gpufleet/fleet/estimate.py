"""One figure of one host at one level, with its uncertainty, and the ratio of two of them.

The statistics are compare's (report/stats.py): a mean with Student's t, and a ratio's
interval on the log scale by the delta method. What differs is where the spread comes from
when a host was measured fewer than three times (compare then shows no interval): the
requests themselves. A level's figure is, to first order, the mean of its requests (the
throughput of a closed loop is concurrency over the mean latency), so its relative
standard error is the relative spread of the matching per-request figure over the square
root of the requests completed (the catalogue's `spread`). That interval is narrower than run-to-run
noise (a relaunch, another minute), so the fleet view and history also ask for a material
difference (`--threshold`) before they name anything.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from gpufleet.fleet.index import Row
from gpufleet.report import catalogue
from gpufleet.report.stats import MIN_REPEATS_FOR_INTERVAL, t95


@dataclass(frozen=True)
class Estimate:
    """A host's figure at one level: the mean of its samples and how sure it is."""

    value: float
    rel_se: float | None  # standard error over the value; None: nothing to tell it by
    dof: int  # degrees of freedom of that error
    samples: int  # measurements behind it (repeats or runs)
    source: str  # "repeats" or "requests": where the spread came from

    def interval(self) -> tuple[float, float] | None:
        if self.rel_se is None:
            return None
        half = t95(max(1, self.dof)) * self.rel_se * self.value
        return max(0.0, self.value - half), self.value + half


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _request_rel_se(row: Row, key: str) -> tuple[float, int] | None:
    """(relative standard error, requests) of one level from its requests' spread."""
    std_key, mean_key = catalogue.spread_keys(key) or (None, None)
    std, mean = _number(row.get(std_key or "")), _number(row.get(mean_key or ""))
    n = int(_number(row.get(catalogue.COMPLETED)) or 0)
    if std is None or not mean or n < 2:
        return None
    return std / mean / math.sqrt(n), n


def estimate(rows: list[Row], key: str) -> Estimate | None:
    """The figure `key` over `rows` (one level's repeats, from one or several runs); None
    when no row has it or a row failed. Three or more: the repeats' own spread; fewer: the
    requests' (module docstring)."""
    ok = [r for r in rows if r.get(catalogue.STATUS) in (None, "ok")]
    values = [v for v in (_number(r.get(key)) for r in ok) if v is not None]
    if not values or len(ok) < len(rows):
        return None
    mean = statistics.fmean(values)
    if len(values) >= MIN_REPEATS_FOR_INTERVAL and mean > 0:
        rel = statistics.stdev(values) / math.sqrt(len(values)) / mean
        return Estimate(mean, rel, len(values) - 1, len(values), "repeats")
    spreads = [_request_rel_se(r, key) for r in ok]
    if mean <= 0 or any(s is None for s in spreads):
        return Estimate(mean, None, 0, len(values), "none")
    rel = math.sqrt(sum(s[0] ** 2 for s in spreads if s)) / len(spreads)
    dof = sum(s[1] for s in spreads if s) - len(spreads)
    return Estimate(mean, rel, max(1, dof), len(values), "requests")


def ratio(a: Estimate, b: Estimate) -> tuple[float, tuple[float, float] | None]:
    """b / a and its 95% interval (log scale, delta method, the smaller side's dof)."""
    value = b.value / a.value
    if a.rel_se is None or b.rel_se is None:
        return value, None
    half = t95(max(1, min(a.dof, b.dof))) * math.sqrt(a.rel_se**2 + b.rel_se**2)
    return value, (value * math.exp(-half), value * math.exp(half))


def scaled(e: Estimate, reference: float) -> tuple[float, tuple[float, float] | None]:
    """e / reference and its interval, the reference taken as exact (a fleet's median)."""
    interval = e.interval()
    value = e.value / reference
    if interval is None:
        return value, None
    return value, (interval[0] / reference, interval[1] / reference)
