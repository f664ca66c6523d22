"""Repeats and their confidence intervals: is a difference between two configurations real?

A level measured n times (`--repeat n`) is summarised by the mean of each figure and a 95%
confidence interval from Student's t (n - 1 degrees of freedom): repeats are few, so the
normal approximation would claim too much. A ratio of two arms' means gets its interval on
the log scale (delta method, the smaller arm's degrees of freedom); "not significant" means
that interval includes 1.0.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpufleet.report import metrics

# Two-sided 95% Student t quantiles by degrees of freedom (1-30); 1.96 beyond.
T95 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip

# Figures that get an interval (the catalogue says which).
CI_KEYS = metrics.interval_keys()


def t95(dof: int) -> float:
    return T95[dof - 1] if 1 <= dof <= len(T95) else 1.96


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high); with one value the interval is that value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's repeats as one row: means of the numbers, `ci` {key: [low, high]},
    `repeats` n. A single row is returned as it is."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[-1])
    for key, value in rows[-1].items():
        values = [r.get(key) for r in rows]
        if isinstance(value, int | float) and not isinstance(value, bool):
            numbers = [float(v) for v in values if isinstance(v, int | float)]
            if len(numbers) == len(rows):
                out[key] = statistics.fmean(numbers)
    for mark in ("client_bound", "client_late"):  # any repeat's counts
        reasons = [str(r[mark]) for r in rows if r.get(mark)]
        out[mark] = "; ".join(dict.fromkeys(reasons)) or None
    out["completed"] = sum(int(r.get("completed", 0)) for r in rows)
    out["failed"] = sum(int(r.get("failed", 0)) for r in rows)
    out["ci"] = {}
    for key in CI_KEYS:
        numbers = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        if len(numbers) == len(rows):
            _, low, high = mean_ci(numbers)
            out["ci"][key] = [low, high]
    out["repeats"] = len(rows)
    out["samples"] = {key: [r.get(key) for r in rows] for key in out["ci"]}
    return out


def ratio_ci(a: dict[str, Any], b: dict[str, Any], key: str) -> tuple[float, float] | None:
    """95% interval of mean(b)/mean(a) for one figure, or None without repeats on both."""
    sa = (a.get("samples") or {}).get(key)
    sb = (b.get("samples") or {}).get(key)
    if not sa or not sb or len(sa) < 2 or len(sb) < 2:
        return None
    ma, mb = statistics.fmean(sa), statistics.fmean(sb)
    if ma <= 0 or mb <= 0:
        return None
    var = statistics.variance(sa) / (len(sa) * ma**2) + statistics.variance(sb) / (len(sb) * mb**2)
    half = t95(min(len(sa), len(sb)) - 1) * math.sqrt(var)
    log_ratio = math.log(mb / ma)
    return math.exp(log_ratio - half), math.exp(log_ratio + half)


def ratio_text(a: dict[str, Any], b: dict[str, Any], key: str) -> str:
    """`1.32x`, or with repeats `1.32x [1.28-1.36]`, and ` n.s.` when 1.0 is inside."""
    va, vb = a.get(key), b.get(key)
    if not isinstance(va, int | float) or not isinstance(vb, int | float) or not va:
        return "-"
    text = f"{vb / va:.2f}x"
    interval = ratio_ci(a, b, key)
    if interval is None:
        return text
    low, high = interval
    return f"{text} [{low:.2f}-{high:.2f}]" + (" n.s." if low <= 1.0 <= high else "")


def half_width(row: dict[str, Any], key: str) -> float | None:
    """The interval's half-width relative to the mean (0.02 = +-2%), with repeats."""
    ci = (row.get("ci") or {}).get(key)
    mean = row.get(key)
    if not ci or not mean:
        return None
    return (ci[1] - ci[0]) / 2 / abs(mean)
