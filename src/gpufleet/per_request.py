"""Each request's own figures, by SGLang bench_serving's definitions (docs/FACTS.md).

One home for what a request's TTFT, TPOT, ITL gaps, end-to-end latency and speeds are:
the runner's percentiles of a level (host/bench/metrics.py) and the report's intervals of
those percentiles, resampled request by request (report/resampling.py), read them here, so
the interval is always around the figure the row carries.

TTFT: request start to first token. TPOT: (e2e - ttft) / (output_tokens - 1). ITL: per
token, a chunk of k tokens counting as k gaps of gap/k (the runner has split them, k from
host/bench/tokencount.py; a level whose k was not knowable says `itl_basis: chunk`).
Per-request output tok/s = output_tokens / e2e; decode tok/s = (output_tokens - 1) /
(e2e - ttft). A request contributes nothing to a series where its figure is undefined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gpufleet.wire import JsonValue


class Timed(Protocol):
    """What the figures need of a finished request (host/bench/level.RequestRecord)."""

    ttft: float
    e2e: float
    itl: list[float]
    completion_tokens: int


@dataclass(frozen=True)
class RequestTimes:
    """A finished request as its archived record (`requests-c64.jsonl`) has it."""

    ttft: float
    e2e: float
    itl: list[float]
    completion_tokens: int

    @classmethod
    def of(cls, fields: Mapping[str, JsonValue], from_due: bool) -> RequestTimes:
        """From an archived record; with `from_due` (an open-loop level) its latencies count
        from when it was due, as the runner counted them (its dispatch lag is latency the
        user would see)."""
        lag = _number(fields, "dispatch_lag") if from_due else 0.0
        gaps = fields.get("itl")
        gaps = gaps if isinstance(gaps, list) else []
        itl = [float(g) for g in gaps if isinstance(g, int | float)]
        return cls(
            ttft=_number(fields, "ttft") + lag,
            e2e=_number(fields, "e2e") + lag,
            itl=itl,
            completion_tokens=int(_number(fields, "completion_tokens")),
        )


def _number(fields: Mapping[str, JsonValue], key: str) -> float:
    value = fields.get(key)
    return float(value) if isinstance(value, int | float) else 0.0


# series -> the scale its values are printed in (seconds -> ms for latencies)
SERIES: dict[str, float] = {
    "ttft_ms": 1000.0,
    "tpot_ms": 1000.0,
    "itl_ms": 1000.0,
    "e2e_latency_ms": 1000.0,
    "per_request_output_tps": 1.0,
    "per_request_decode_tps": 1.0,
}


def values(request: Timed, series: str) -> list[float]:
    """This request's values in one series (one each, ITL one per gap; none where the
    figure is undefined), unscaled."""
    tokens, e2e, ttft = request.completion_tokens, request.e2e, request.ttft
    if series == "ttft_ms":
        return [ttft]
    if series == "e2e_latency_ms":
        return [e2e]
    if series == "itl_ms":
        return list(request.itl)
    if series == "tpot_ms":
        return [(e2e - ttft) / (tokens - 1)] if tokens > 1 else []
    if series == "per_request_output_tps":
        return [tokens / e2e] if e2e > 0 else []
    if series == "per_request_decode_tps":
        return [(tokens - 1) / (e2e - ttft)] if tokens > 1 and e2e > ttft else []
    raise KeyError(f"no per-request series {series!r} (one of {', '.join(SERIES)})")


def series_values(requests: list[Timed], series: str) -> list[float]:
    """A level's values in one series, in request order, scaled for printing."""
    scale = SERIES[series]
    return [v * scale for r in requests for v in values(r, series)]


# written on an open-loop level's row only (host/bench/metrics.py: its queue waits), whose
# latencies count from when each request was due
OPEN_LOOP_KEY = "median_queue_wait_ms"
