"""Intervals for percentiles (TTFT p99, ITL p50, ...): resampled, request by request.

A t interval of three repeats' p99s assumes the p99 is normal around its mean and says
nothing about how many requests each p99 stood on; it can even put a p50's interval above
the p99's. Here a level's percentile is resampled in two stages, as the data was made:
the repeats with replacement, then each repeat's requests with replacement (a request
brings all its ITL gaps: gaps of one request are not independent). Each draw's statistic
is what the row carries, the mean over repeats of each repeat's percentile, so the
interval (the draws' 2.5th and 97.5th percentiles) is around the printed figure.

Every percentile of one series is taken from the same resampled requests in each draw,
so within a draw p50 <= p90 <= p99, and so are their intervals' ends: the ordering the
data guarantees is never contradicted. Draws are seeded from the level's runs, so the
same archive prints the same interval.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpufleet import per_request
from gpufleet.report import catalogue

DRAWS = 1000
CHUNK = 4_000_000  # elements of one (draws x values) block
# A series of more values than this (ITL: one per gap, 256k for 1,000 requests of 256
# tokens) is resampled by rank bins: each draw's count per bin is one matrix product, and
# its percentile is interpolated inside the bin it falls in, off by at most one bin's
# share of the ranks (1/BINS) from the exact expanded sample's.
EXACT_UP_TO = 20_000
BINS = 1024


def seed_of(parts: Sequence[object]) -> int:
    """A seed from what identifies a level's runs (their start times, the level)."""
    return zlib.crc32(repr(list(parts)).encode())


@dataclass(frozen=True)
class Resampled:
    """One percentile of a level: the figure as the rows carry it (the mean over repeats of
    each repeat's percentile, recomputed from the requests) and its resampled draws."""

    point: float
    draws: np.ndarray


def percentile_draws(
    repeats: list[list[per_request.Timed]], keys: Sequence[str], seed: int
) -> dict[str, Resampled]:
    """key -> its figure and resampled statistic, for each key that is a percentile of a
    per-request series (catalogue.quantile_of) with values in every repeat."""
    wanted: dict[str, list[tuple[str, float]]] = {}
    for key in keys:
        found = catalogue.quantile_of(key)
        if found:
            wanted.setdefault(found[0], []).append((key, found[1]))
    if not wanted or not repeats or any(not r for r in repeats):
        return {}
    rng = np.random.default_rng(seed)
    weights = [
        rng.multinomial(len(r), np.full(len(r), 1 / len(r)), size=DRAWS).astype(np.int32)
        for r in repeats
    ]
    picks = rng.integers(0, len(repeats), size=(DRAWS, len(repeats)))
    out: dict[str, Resampled] = {}
    for series, quantiles in wanted.items():
        per_repeat = [_resampled(r, series, [q for _, q in quantiles], w)
                      for r, w in zip(repeats, weights, strict=True)]  # fmt: skip
        found = [p for p in per_repeat if p is not None]
        if len(found) < len(per_repeat):
            continue
        for i, (key, _) in enumerate(quantiles):
            table = np.stack([draws[:, i] for _, draws in found])  # repeats x draws
            statistic = table[picks, np.arange(DRAWS)[:, None]].mean(axis=1)
            point = float(np.mean([points[i] for points, _ in found]))
            out[key] = Resampled(point, statistic[np.isfinite(statistic)])
    return out


def interval(draws: np.ndarray, estimate: float) -> tuple[float, float]:
    """The draws' central 95%, widened to hold the estimate (with few requests a p99's
    draws can all sit on one side of it)."""
    low, high = np.percentile(draws, [2.5, 97.5])
    return min(float(low), estimate), max(float(high), estimate)


def _series(requests: list[per_request.Timed], series: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, index of the request each came from), values scaled as printed."""
    values, owners = [], []
    for i, r in enumerate(requests):
        own = per_request.values(r, series)
        values += own
        owners += [i] * len(own)
    return np.asarray(values, dtype=float) * per_request.SERIES[series], np.asarray(owners)


def _resampled(
    requests: list[per_request.Timed], series: str, quantiles: list[float], weights: np.ndarray
) -> tuple[list[float], np.ndarray] | None:
    """(the series' percentiles, draws x quantiles: each draw's percentiles of the series,
    its requests counted as many times as the draw picked them, by the same rank rule as
    numpy's and metrics.py's linear interpolation on the expanded sample)."""
    values, owners = _series(requests, series)
    if not values.size:
        return None
    order = np.argsort(values, kind="stable")
    values, owners = values[order], owners[order]
    points = [float(v) for v in np.percentile(values, quantiles)]
    if values.size > EXACT_UP_TO:
        return points, _resampled_by_bins(values, owners, len(requests), quantiles, weights)
    draws = weights.shape[0]
    out = np.empty((draws, len(quantiles)))
    step = max(1, CHUNK // values.size)
    for start in range(0, draws, step):
        counts = weights[start : start + step][:, owners]  # block x values
        cumulative = np.cumsum(counts, axis=1, dtype=np.int64)
        total = cumulative[:, -1]
        for j, q in enumerate(quantiles):
            rank = (total - 1) * q / 100
            low, high = np.floor(rank), np.ceil(rank)
            at_low = values[np.minimum(_find(cumulative, low), values.size - 1)]
            at_high = values[np.minimum(_find(cumulative, high), values.size - 1)]
            figure = at_low + (at_high - at_low) * (rank - low)
            out[start : start + step, j] = np.where(total > 0, figure, np.nan)
    return points, out


def _find(cumulative: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row, how many of its running counts are <= its target (searchsorted 'right' on
    every row at once: rows shifted apart so the flattened array stays sorted)."""
    rows, width = cumulative.shape
    shift = (np.abs(cumulative[:, -1]).max() + np.abs(targets).max() + 2) * np.arange(rows)
    flat = (cumulative + shift[:, None]).ravel()
    return np.searchsorted(flat, targets + shift, side="right") - width * np.arange(rows)


def _resampled_by_bins(
    values: np.ndarray, owners: np.ndarray, requests: int, quantiles: list[float],
    weights: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """_resampled for a long series: the sorted values cut into BINS runs of equal length;
    each draw weighs a run by its requests' picks, and a rank inside a run is placed
    proportionally among the run's own values."""
    size = values.size
    run_of = (np.arange(size) * BINS) // size
    per_request = np.zeros((requests, BINS))
    np.add.at(per_request, (owners, run_of), 1.0)
    starts = np.searchsorted(run_of, np.arange(BINS))
    lengths = np.bincount(run_of, minlength=BINS)
    counts = weights.astype(float) @ per_request  # draws x runs
    cumulative = np.cumsum(counts, axis=1)
    total = cumulative[:, -1]
    out = np.empty((weights.shape[0], len(quantiles)))
    rows = np.arange(weights.shape[0])
    for j, q in enumerate(quantiles):
        rank = (total - 1) * q / 100 + 0.5  # the value's middle, in the weighed ranks
        run = np.minimum(_find(cumulative, rank), BINS - 1)
        before = np.where(run > 0, cumulative[rows, np.maximum(run - 1, 0)], 0.0)
        weight = counts[rows, run]
        share = np.clip(np.divide(rank - before, weight, out=np.zeros_like(rank),
                                  where=weight > 0), 0.0, 1.0)  # fmt: skip
        at = starts[run] + share * (lengths[run] - 1)
        low = np.floor(at).astype(int)
        high = np.minimum(low + 1, size - 1)
        figure = values[low] + (values[high] - values[low]) * (at - low)
        out[:, j] = np.where(total > 0, figure, np.nan)
    return out
