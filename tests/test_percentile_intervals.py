"""Intervals of percentiles (issue 67.4): resampled over repeats and their requests
(report/resampling.py), around the figure the row carries, never contradicting p50 <= p99.

The property test builds levels from random requests (ragged ITL gaps, undefined TPOTs),
summarises each repeat with the runner's own code (host/bench/metrics.py), and checks what
must hold of any data: the interval holds its figure, a lower percentile's interval ends
never lie above a higher one's, and the same archive gives the same interval."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet import per_request
from gpufleet.host.bench import metrics
from gpufleet.host.bench.level import LevelRun, RequestRecord
from gpufleet.records import ResultRow
from gpufleet.report import catalogue, resampling
from gpufleet.report.stats import aggregate, ratio_ci

PERCENTILES = [k for k in catalogue.interval_keys() if catalogue.quantile_of(k)]
ORDERED = [("median_ttft_ms", "p99_ttft_ms"), ("median_itl_ms", "p99_itl_ms"),
           ("median_tpot_ms", "p99_tpot_ms")]  # fmt: skip


def _requests(rnd: random.Random, count: int, scale: float) -> list[RequestRecord]:
    out = []
    for i in range(count):
        tokens = rnd.choice([1, 2, 8, 32])
        ttft = rnd.lognormvariate(-3, 1) * scale
        itl = [rnd.expovariate(100) * scale for _ in range(tokens - 1)]
        out.append(RequestRecord(index=i, ok=True, ttft=ttft, e2e=ttft + sum(itl), itl=itl,
                                 completion_tokens=tokens, start=float(i)))  # fmt: skip
    return out


def _row(records: list[RequestRecord], c: int, repeat: int) -> ResultRow:
    run = LevelRun(
        concurrency=c,
        request_rate=float("inf"),
        records=records,
        duration=10.0,
        started_at="2026-12-05T00:00:00Z",
    )
    figures = metrics.summarize(run, "sglang")
    return ResultRow.from_wire({**figures, "max_concurrency": c, "repeat": repeat,
                                "started_at": f"2026-12-05T00:00:0{repeat}Z"})  # fmt: skip


def _level(seed: int, repeats: int, count: int, scales: list[float]):
    rnd = random.Random(seed)
    requests = [_requests(rnd, count, scales[k % len(scales)]) for k in range(repeats)]
    rows = [_row(r, 4, k + 1) for k, r in enumerate(requests)]
    return rows, requests


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    repeats=st.integers(3, 5),
    count=st.integers(3, 60),
    scales=st.lists(st.floats(0.2, 5.0), min_size=1, max_size=3),
)
def test_percentile_intervals_hold_their_figure_and_the_order_of_percentiles(
    seed, repeats, count, scales
):
    rows, requests = _level(seed, repeats, count, scales)
    figures = aggregate(rows, requests)
    # every percentile the catalogue gives an interval is resampled (the runner's figures
    # are reproduced from the requests), none is a t interval of the repeats' percentiles;
    # a series with no value in some repeat (every request one token: no ITL) has none
    present = [k for k in PERCENTILES
               if all(per_request.series_values(r, catalogue.quantile_of(k)[0]) for r in requests)]  # fmt: skip
    assert set(figures.ci) & set(PERCENTILES) == set(present), (present, sorted(figures.ci))
    for key in present:
        low, high = figures.ci[key]
        assert low <= figures.get(key) <= high, (key, low, figures.get(key), high)
    for lower, higher in [(a, b) for a, b in ORDERED if a in present]:
        assert figures.ci[lower][0] <= figures.ci[higher][0], (lower, higher)
        assert figures.ci[lower][1] <= figures.ci[higher][1], (lower, higher)
    again = aggregate(rows, requests)
    assert again.ci == figures.ci  # seeded from the runs: the same archive, the same interval


def test_a_t_interval_would_put_the_median_above_the_p99_and_resampling_does_not():
    """Repeats whose medians scatter while their p99s agree (every repeat's slowest
    requests take 1 s): Student's t over the three medians reaches past the p99's whole
    interval, which says the median may exceed the p99; the resampled intervals keep the
    order the data guarantees."""
    requests = []
    for slow in (40, 20, 4):  # of 40 requests, this many take 1 s, the rest 0.1 s
        times = [1.0] * slow + [0.1] * (40 - slow)
        requests.append(
            [
                RequestRecord(
                    index=i, ok=True, ttft=t, e2e=t + 0.07, itl=[0.01] * 7, completion_tokens=8
                )
                for i, t in enumerate(times)
            ]
        )
    rows = [_row(r, 4, k + 1) for k, r in enumerate(requests)]
    from gpufleet.report.stats import mean_ci

    _, _, t_median_high = mean_ci([float(r.median_ttft_ms) for r in rows])
    _, _, t_p99_high = mean_ci([float(r.p99_ttft_ms) for r in rows])
    assert t_median_high > t_p99_high  # the contradiction the old intervals printed
    figures = aggregate(rows, requests)
    assert figures.ci["median_ttft_ms"][1] <= figures.ci["p99_ttft_ms"][1] == 1000.0


def test_without_its_requests_a_percentile_gets_no_interval_not_a_t_interval():
    rows, _requests_kept = _level(3, 3, 20, [1.0, 2.0])
    bare = aggregate(rows)
    assert "output_throughput" in bare.ci
    assert not set(PERCENTILES) & set(bare.ci)
    # requests that do not reproduce the row's figure (another run's) give none either
    _, others = _level(4, 3, 20, [1.0])
    assert not set(PERCENTILES) & set(aggregate(rows, others).ci)


def test_a_ratio_of_percentiles_comes_from_the_draws_and_holds_the_ratio():
    rows_a, req_a = _level(11, 3, 30, [1.0])
    rows_b, req_b = _level(12, 3, 30, [2.0])
    a, b = aggregate(rows_a, req_a), aggregate(rows_b, req_b)
    low, high = ratio_ci(a, b, "median_ttft_ms")
    ratio = b.get("median_ttft_ms") / a.get("median_ttft_ms")
    assert low <= ratio <= high and low > 1.0  # twice as slow: significant


def test_a_long_series_is_resampled_by_bins_within_a_bin_of_the_exact_answer(monkeypatch):
    _rows, requests = _level(5, 3, 60, [1.0])
    exact = resampling.percentile_draws(requests, ["median_itl_ms", "p99_itl_ms"], 1)
    monkeypatch.setattr(resampling, "EXACT_UP_TO", 10)
    monkeypatch.setattr(resampling, "BINS", 256)
    binned = resampling.percentile_draws(requests, ["median_itl_ms", "p99_itl_ms"], 1)
    for key in exact:
        e = np.percentile(exact[key].draws, [2.5, 50, 97.5])
        b = np.percentile(binned[key].draws, [2.5, 50, 97.5])
        assert np.allclose(e, b, rtol=0.05), (key, e, b)
