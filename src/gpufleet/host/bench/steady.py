"""A level's steady window: all its requests in flight, ramp-up and drain left out.

Whole-level figures mix the ramp-up (the first requests meet an idle server) and the drain
(the last ones run with fewer neighbours). The steady window runs from the first moment the
level holds its full concurrency (closed loop) or its first completion (open loop) to the
last send; after it the level only drains. Figures over it sit beside the whole-level ones,
as vLLM's newer benchmark client reports them.
"""

from __future__ import annotations

import statistics
from typing import Any, TypedDict

from gpufleet.host.bench.level import LevelRun, RequestRecord


def _first_full(ok: list[RequestRecord], concurrency: int) -> float | None:
    """When `concurrency` requests were first in flight at once."""
    events = sorted([(r.start, 1) for r in ok] + [(r.start + r.e2e, -1) for r in ok])
    running = 0
    for at, step in events:
        running += step
        if running >= concurrency:
            return at
    return None


def window(run: LevelRun) -> tuple[float, float] | str:
    """(start, end) of the steady window, seconds since the level began, or why none."""
    ok = [r for r in run.records if r.ok]
    if not ok:
        return "no completed request"
    last_send = max(r.start for r in ok)
    if run.open_loop:
        start = min(r.start + r.e2e for r in ok)
    else:
        full = _first_full(ok, run.concurrency)
        if full is None:
            return f"never {run.concurrency} requests in flight at once"
        start = full
    median_e2e = statistics.median(r.e2e for r in ok)
    if last_send - start < median_e2e:
        return (
            f"too short for a steady window ({max(0.0, last_send - start):.2f} s at full load, "
            f"less than one request's {median_e2e:.2f} s)"
        )
    return start, last_send


class SteadyFigures(TypedDict, total=False):
    """A level's figures over its steady window, merged into its result row; either the
    figures or `steady_note` (why the level has no window)."""

    steady_note: str
    steady_duration: float  # seconds
    steady_output_throughput: float  # tokens streamed inside the window, per second
    steady_requests: int  # requests sent and finished inside it
    steady_median_ttft_ms: float
    steady_median_tpot_ms: float | None
    steady_median_per_request_output_tps: float


def figures(run: LevelRun, token_times: Any) -> SteadyFigures:
    """`steady_*` figures over the window, or `steady_note` saying why there are none."""
    span = window(run)
    if isinstance(span, str):
        return {"steady_note": span}
    start, end = span
    ok = [r for r in run.records if r.ok]
    tokens = sum(1 for r in ok for t in token_times(r) if start <= t <= end)
    inside = [r for r in ok if r.start >= start and r.start + r.e2e <= end]
    out: SteadyFigures = {
        "steady_duration": end - start,
        "steady_output_throughput": tokens / (end - start),
        "steady_requests": len(inside),
    }
    if inside:
        tpots = [
            (r.e2e - r.ttft) / (r.completion_tokens - 1) for r in inside if r.completion_tokens > 1
        ]
        out["steady_median_ttft_ms"] = statistics.median(r.ttft for r in inside) * 1000
        out["steady_median_tpot_ms"] = statistics.median(tpots) * 1000 if tpots else None
        out["steady_median_per_request_output_tps"] = statistics.median(
            r.completion_tokens / r.e2e for r in inside if r.e2e > 0
        )
    return out
