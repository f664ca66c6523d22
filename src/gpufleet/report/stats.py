"""Repeats and their confidence intervals: is a difference between two configurations real?

A level measured n times (`--repeat n`) is summarised by the mean of each figure and a 95%
confidence interval from Student's t (n - 1 degrees of freedom): repeats are few, so the
normal approximation would claim too much. A ratio of two arms' means gets its interval on
the log scale (delta method, the smaller arm's degrees of freedom); "not significant" means
that interval includes 1.0.

A percentile (TTFT p99, ITL p50, ...) is not a mean: its interval, and its ratio's, come
from resampling the repeats and their requests (report/resampling.py). Without the requests
(a run archived without them) a percentile gets no interval rather than a t interval.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufleet import per_request
from gpufleet.records import ResultRow
from gpufleet.report import catalogue, resampling
from gpufleet.report.notes import said_once
from gpufleet.wire import JsonDict

# Two-sided 95% Student t quantiles by degrees of freedom (1-30); beyond, the Cornish-Fisher
# expansion around the normal quantile (t95 below), so nothing jumps at 31.
T95 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip

# Figures that get an interval (the catalogue says which).
CI_KEYS = catalogue.interval_keys()
# Two repeats give Student's t one degree of freedom (12.7 x the standard error): intervals
# that reach below zero and ratios of [0.00-997439.59], which say nothing. From three on
# (4.3 x) an interval is shown; below, the answer says so.
MIN_REPEATS_FOR_INTERVAL = 3


Z975 = 1.959963984540054  # the normal distribution's 97.5% quantile


def t95(dof: int) -> float:
    """Student's t 97.5% quantile: the table to 30 degrees of freedom, then the
    Cornish-Fisher expansion in 1/dof (within 1e-5 of the exact value from 30 on; 1.96
    was 4% narrow at 31, where t is 2.040)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be at least 1, not {dof}")
    if dof <= len(T95):
        return T95[dof - 1]
    z, v = Z975, float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high); with one value the interval is that value. The figures that get
    an interval are never negative (throughputs, latencies, speeds), so neither is the
    interval's low end: it stops at zero, as the plots' error bars do."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    low = mean - half
    if all(v >= 0 for v in values):
        low = max(0.0, low)
    return mean, low, mean + half


@dataclass
class LevelFigures:
    """One level of one arm, its repeats as one record: each figure's mean (a ResultRow),
    and for the figures that get one (the catalogue says which) the 95% interval and the
    repeats' own values. A level measured once is its row, with no interval."""

    row: ResultRow
    repeats: int = 1
    measured: int = 1  # the repeats that completed a request: the means are theirs
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    # a percentile's resampled statistic (report/resampling.py), for its ratios' intervals
    draws: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A figure by its results.jsonl name (ResultRow.get), for catalogue-driven code;
        `default` for a figure measured from completions at a level that completed none
        (its 0 tok/s and 0 ms were never measured: no table, ratio or sentence uses them)."""
        if not self.measured and catalogue.from_completions(key):
            return default
        return self.row.get(key, default)

    def to_json(self) -> JsonDict:
        """As the report page's data has it: the row's figures, and with repeats `ci`,
        `samples` and `repeats`."""
        out = self.row.to_wire()
        if self.repeats > 1:
            out.update(ci={k: list(v) for k, v in self.ci.items()}, samples=self.samples,
                       repeats=self.repeats, measured_repeats=self.measured)  # fmt: skip
        return out


def measured(row: ResultRow) -> bool:
    """Whether a level (one repeat) completed any request: one that completed none measured
    nothing, and its zeros are not figures. An archive without the count is taken as
    measured, as it always was."""
    return row.completed != 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def aggregate(
    rows: list[ResultRow], requests: list[list[per_request.Timed]] | None = None
) -> LevelFigures:
    """One level's repeats as one record: the mean of every figure all repeats have, the
    marks any repeat raised, the requests summed, intervals for the catalogue's keys.
    `requests`: each repeat's finished requests, in the rows' order, for the percentiles'
    intervals. A repeat that completed no request adds its counts but none of its zeros:
    the figures measured from completions are the means of the repeats that measured them
    (`measured` says how many)."""
    if len(rows) == 1:
        return LevelFigures(rows[0], measured=int(measured(rows[0])))
    kept = [i for i, r in enumerate(rows) if measured(r)]
    if requests is not None and len(requests) == len(rows):
        requests = [requests[i] for i in kept]
    last = rows[-1]
    means: dict[str, float | str | None] = {}  # field -> the repeats' mean (marks: joined)
    for f in dataclasses.fields(ResultRow):
        values = [getattr(r, f.name) for r in _counted(rows, kept, f.name)]
        if f.init and values and _number(values[-1]) and all(_number(v) for v in values):
            means[f.name] = statistics.fmean(float(v) for v in values)
    extra = dict(last.extra)
    for key in last.extra:
        values = [r.extra.get(key) for r in _counted(rows, kept, key)]
        if values and _number(values[-1]) and all(_number(v) for v in values):
            extra[key] = statistics.fmean(float(v) for v in values)
    # any repeat's marks and token-count notes, said once (the last repeat's alone lost
    # a note only an earlier repeat raised)
    for mark in ("client_bound", "client_late", "output_tokens_note"):
        reasons = [(0, str(getattr(r, mark))) for r in rows if getattr(r, mark)]
        means[mark] = "; ".join(text for _, text in said_once(reasons)) or None
    sources = dict.fromkeys(r.output_tokens_source for r in rows if r.output_tokens_source)
    means["output_tokens_source"] = " / ".join(sources) or None
    bases = [r.itl_basis for r in rows if r.itl_basis]
    means["itl_basis"] = "chunk" if "chunk" in bases else bases[0] if bases else None
    # a level failed where any repeat did (a failed request's level is failed), not as the
    # last repeat alone says: a failed first repeat read ok, a failed last one failed
    worse = [r.level_status for r in rows if r.level_status not in (None, "ok")]
    means[catalogue.STATUS] = worse[0] if worse else last.level_status
    means[catalogue.COMPLETED] = sum(int(r.completed or 0) for r in rows)
    means[catalogue.FAILED] = sum(int(r.failed or 0) for r in rows)
    row = dataclasses.replace(last, extra=extra, **means)
    row.given = last.given
    figures = LevelFigures(row, repeats=len(rows), measured=len(kept))
    rows = [rows[i] for i in kept]
    if len(rows) < MIN_REPEATS_FOR_INTERVAL:
        return figures
    resampled = _percentile_draws(rows, figures.row, requests)
    for key in CI_KEYS:
        numbers = [r.get(key) for r in rows]
        if not all(_number(v) for v in numbers):
            continue
        figures.samples[key] = [float(v) for v in numbers]
        if catalogue.quantile_of(key) is None:
            _, low, high = mean_ci(figures.samples[key])
            figures.ci[key] = (low, high)
        elif key in resampled:
            figures.draws[key] = resampled[key]
            figures.ci[key] = resampling.interval(resampled[key], float(figures.row.get(key)))
    return figures


def _counted(rows: list[ResultRow], kept: list[int], key: str) -> list[ResultRow]:
    """The repeats a figure's mean is over: those that measured it (all, for a figure not
    measured from completions, such as a count or the SLO's share of requests sent)."""
    if not catalogue.from_completions(key):
        return rows
    return [rows[i] for i in kept]


def _percentile_draws(
    rows: list[ResultRow], mean: ResultRow, requests: list[list[per_request.Timed]] | None
) -> dict[str, np.ndarray]:
    """The percentiles' resampled statistics, for each whose figure the requests reproduce
    (a row written from other requests, or by another definition, gets none)."""
    if not requests or len(requests) != len(rows):
        return {}
    keys = [k for k in CI_KEYS if catalogue.quantile_of(k)]
    seed = resampling.seed_of([(r.started_at, r.max_concurrency, r.repeat) for r in rows])
    kept = {}
    for key, found in resampling.percentile_draws(requests, keys, seed).items():
        figure = mean.get(key)
        if (
            _number(figure)
            and found.draws.size
            and math.isclose(figure, found.point, rel_tol=1e-6, abs_tol=1e-9)
        ):
            kept[key] = found.draws
    return kept


def ratio_ci(a: LevelFigures, b: LevelFigures, key: str) -> tuple[float, float] | None:
    """95% interval of mean(b)/mean(a) for one figure, or None without repeats on both. A
    percentile's from its resampled statistics (widened to hold the ratio itself)."""
    if key in a.draws and key in b.draws:
        return _ratio_of_draws(a, b, key)
    if catalogue.quantile_of(key):
        return None
    sa, sb = a.samples.get(key), b.samples.get(key)
    if not sa or not sb or min(len(sa), len(sb)) < MIN_REPEATS_FOR_INTERVAL:
        return None
    ma, mb = statistics.fmean(sa), statistics.fmean(sb)
    if ma <= 0 or mb <= 0:
        return None
    var = statistics.variance(sa) / (len(sa) * ma**2) + statistics.variance(sb) / (len(sb) * mb**2)
    half = t95(min(len(sa), len(sb)) - 1) * math.sqrt(var)
    log_ratio = math.log(mb / ma)
    return math.exp(log_ratio - half), math.exp(log_ratio + half)


def _ratio_of_draws(a: LevelFigures, b: LevelFigures, key: str) -> tuple[float, float] | None:
    da, db = a.draws[key], b.draws[key]
    size = min(da.size, db.size)
    va, vb = a.get(key), b.get(key)
    if not size or not va or not vb or np.any(da[:size] <= 0):
        return None
    low, high = np.percentile(db[:size] / da[:size], [2.5, 97.5])
    return min(float(low), vb / va), max(float(high), vb / va)


def with_interval(value: float, interval: tuple[float, float] | None, places: int = 2,
                  suffix: str = "") -> str:  # fmt: skip
    """A figure and its 95% interval in one precision (`1.37x [1.36-1.38]`), so the printed
    figure always lies inside its printed interval; the one place that formats them."""
    text = f"{value:.{places}f}{suffix}"
    if interval is None:
        return text
    low, high = interval
    return f"{text} [{low:.{places}f}-{high:.{places}f}]"


def ratio_text(a: LevelFigures, b: LevelFigures, key: str, intervals: bool = True) -> str:
    """`1.32x`, or with repeats `1.32x [1.28-1.36]` (unless not `intervals`: a narrow
    table), and ` n.s.` when 1.0 is inside."""
    va, vb = a.get(key), b.get(key)
    if not isinstance(va, int | float) or not isinstance(vb, int | float) or not va:
        return "-"
    interval = ratio_ci(a, b, key)
    text = with_interval(vb / va, interval if intervals else None, suffix="x")
    return text + (" n.s." if interval and interval[0] <= 1.0 <= interval[1] else "")


def half_width(level: LevelFigures, key: str) -> float | None:
    """The interval's half-width relative to the mean (0.02 = +-2%), with repeats."""
    ci, mean = level.ci.get(key), level.get(key)
    if not ci or not mean:
        return None
    return (ci[1] - ci[0]) / 2 / abs(mean)
