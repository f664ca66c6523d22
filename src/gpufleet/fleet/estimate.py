"""One figure of one host at one level, with its uncertainty, and the ratio of two of them.

The statistics are compare's (report/stats.py): a mean with Student's t, and a ratio's
interval on the log scale by the delta method. What differs is where the spread comes from
when a host was measured fewer than three times (compare then shows no interval): the
requests themselves. A level's figure is, to first order, the mean of its requests (the
throughput of a closed loop is concurrency over the mean latency), so its relative
standard error is the relative spread of the matching per-request figure over the square
root of the requests completed (the catalogue's `spread`). That interval is narrower than run-to-run
noise (a relaunch, another minute): on a busy fleet two stock hosts read 0.88x with intervals
of +-6% from their requests alone. So the fleet view widens it by a run-to-run term
(`with_run_noise`): the larger of the host's own round-to-round changes (where it has four
earlier rounds) and the fleet's (each host's change from one round to the next, less the
change the whole fleet made in that round, robustly pooled); with no earlier round, the
fleet's spread across hosts in this round (an upper bound: it holds the hosts' differences
too). It also asks for a material difference (`--threshold`).
"""

from __future__ import annotations

import itertools
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
    source: str  # "repeats", "requests", or a run-to-run term's (RUN_NOISE): its spread's source

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


# where a run-to-run term came from (with_run_noise), as the json's "source" says it
OWN_ROUNDS, FLEET_ROUNDS, FLEET_SPREAD = "own rounds", "fleet rounds", "fleet spread"
MAD_TO_SD = 1.4826  # a normal distribution's standard deviation over its MAD


def with_run_noise(e: Estimate, rel_sd: float, dof: int, source: str) -> Estimate:
    """`e` (from fewer than three repeats) with the run-to-run variance of one run
    (`rel_sd`, relative, from `dof` degrees of freedom) added over its runs."""
    if e.source == "repeats" or (e.rel_se is None and rel_sd <= 0):
        return e
    rel = math.sqrt((e.rel_se or 0.0) ** 2 + rel_sd**2 / max(1, e.samples))
    return Estimate(e.value, rel, max(1, dof), e.samples, source)


def between_rounds_sd(series: list[list[float]]) -> tuple[float, int] | None:
    """The run-to-run relative spread from round-to-round changes: `series` is each host's
    values, oldest first, the newest rounds aligned. A change the whole fleet made in the
    same round (an upgrade, a hot afternoon) is taken out (the hosts' median change at that
    round, where three or more hosts have it), and the rest pooled by their median absolute
    size, so a transient slow moment on one host moves it little. A change of two runs has
    sqrt(2) times one run's spread."""
    by_step: dict[int, list[float]] = {}
    for values in series:
        steps = [math.log(b / a) for a, b in itertools.pairwise(values) if a > 0 and b > 0]
        for back, change in enumerate(reversed(steps)):
            by_step.setdefault(back, []).append(change)
    residuals = []
    for changes in by_step.values():
        shared = statistics.median(changes) if len(changes) >= MIN_REPEATS_FOR_INTERVAL else 0.0
        residuals += [abs(x - shared) for x in changes]
    if len(residuals) < MIN_REPEATS_FOR_INTERVAL:
        return None
    return MAD_TO_SD * statistics.median(residuals) / math.sqrt(2), len(residuals)
