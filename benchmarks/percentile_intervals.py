"""What the percentiles' resampled intervals cost (report/resampling.py): one level of
three repeats, every percentile the catalogue gives an interval, at request counts and
output lengths a user runs; and how the interval compares with Student's t over the
repeats' percentiles on the same data.

    python benchmarks/percentile_intervals.py
"""

from __future__ import annotations

import random
import time

from gpufleet.host.bench import metrics
from gpufleet.host.bench.level import LevelRun, RequestRecord
from gpufleet.records import ResultRow
from gpufleet.report.stats import aggregate, mean_ci

SHAPES = ((200, 32), (1000, 256), (4000, 256))


def _repeat(rnd: random.Random, count: int, tokens: int, k: int):
    records = []
    for i in range(count):
        ttft = rnd.lognormvariate(-3, 0.5)
        itl = [rnd.expovariate(100) for _ in range(tokens - 1)]
        records.append(RequestRecord(index=i, ok=True, ttft=ttft, e2e=ttft + sum(itl), itl=itl,
                                     completion_tokens=tokens, start=float(i)))  # fmt: skip
    run = LevelRun(concurrency=8, request_rate=float("inf"), records=records, duration=60.0,
                   started_at="2026-12-05T00:00:00Z")  # fmt: skip
    row = ResultRow.from_wire({**metrics.summarize(run, "sglang"), "max_concurrency": 8,
                               "repeat": k, "started_at": f"2026-12-05T00:0{k}:00Z"})  # fmt: skip
    return row, records


def main() -> None:
    rnd = random.Random(0)
    warm = [_repeat(rnd, 5, 4, k + 1) for k in range(3)]  # numpy's first call, not counted
    aggregate([m[0] for m in warm], [m[1] for m in warm])
    print("requests x tokens   seconds   TTFT p99 ms [resampled]      [t over repeats]")
    for count, tokens in SHAPES:
        made = [_repeat(rnd, count, tokens, k + 1) for k in range(3)]
        rows, requests = [m[0] for m in made], [m[1] for m in made]
        start = time.perf_counter()
        figures = aggregate(rows, requests)
        took = time.perf_counter() - start
        low, high = figures.ci["p99_ttft_ms"]
        _, t_low, t_high = mean_ci([float(r.p99_ttft_ms) for r in rows])
        print(f"{count:>8} x {tokens:<8} {took:8.2f}   {figures.get('p99_ttft_ms'):7.1f} "
              f"[{low:.1f}-{high:.1f}]   [{t_low:.1f}-{t_high:.1f}]")  # fmt: skip


if __name__ == "__main__":
    main()
