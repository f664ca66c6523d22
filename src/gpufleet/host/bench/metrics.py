"""Figures from request records, with SGLang bench_serving's definitions (docs/FACTS.md).

TTFT: request start to first token. TPOT: (e2e - ttft) / (output_tokens - 1) per request.
ITL: per token whatever the server's usage habit: a chunk of k tokens counts as k gaps of
gap/k (as bench_serving's sglang backend), k from host/bench/tokencount.py; where no k was
knowable the gaps are per chunk and `itl_basis` says so. Output tokens: the server's count
where consistent, else the model's tokenizer, else the chunks (`output_tokens_source`).
Throughputs divide by the level's wall duration. `concurrency` is bench_serving's: the sum
of e2e latencies over the duration (mean requests in flight), not the cap (`max_concurrency`).
Per-request output tok/s = output_tokens / e2e latency (gpufleet's addition); per-request
decode tok/s = (output_tokens - 1) / (e2e - ttft), the same request's speed once its first
token is out (1000 / its TPOT): the crossover uses the first, `inv compare --wide` shows both.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import statistics
from typing import Any

from gpufleet import per_request
from gpufleet.host.bench import clientcert, steady, tokencount
from gpufleet.host.bench import slo as slos
from gpufleet.host.bench.level import LevelRun, RequestRecord
from gpufleet.host.bench.overload import open_loop_rates
from gpufleet.records import Figures, TurnFigures

DEFINITIONS = (
    "SGLang bench_serving definitions: TTFT = first token latency; TPOT = (e2e - ttft) / "
    "(output_tokens - 1); ITL = per token: the gap before a chunk of k tokens counts as k "
    "gaps of gap/k (k from the server's per-chunk usage, else the model's tokenizer; else "
    "1, and itl_basis says 'chunk'); output_tokens = the server's usage where consistent "
    "with the stream, else the model's tokenizer on the streamed text, else the chunks "
    "(output_tokens_source); per_request_output_tps = output_tokens / e2e. AIPerf's 'ITL' is "
    "this TPOT; GuideLLM's TPOT includes the first token."
)


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return 0.0
    data = sorted(values)
    k = (len(data) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)


def _stats(prefix: str, vals: list[float]) -> dict[str, float]:
    return {
        f"mean_{prefix}": statistics.fmean(vals) if vals else 0.0,
        f"median_{prefix}": statistics.median(vals) if vals else 0.0,
        f"std_{prefix}": statistics.pstdev(vals) if len(vals) > 1 else 0.0,
        f"p90_{prefix}": percentile(vals, 90),
        f"p95_{prefix}": percentile(vals, 95),
        f"p99_{prefix}": percentile(vals, 99),
    }


def _token_times(record: RequestRecord) -> list[float]:
    """When each output token arrived, seconds after the level began, as the ITL assigns
    them: per token, the first chunk's tokens at the TTFT and each gap one token's; per
    chunk (no chunk's k knowable), the count shared evenly over the chunks, not piled on
    the first (which put a whole answer's tokens in its first second)."""
    first = record.start + record.ttft
    arrivals = [first]
    for gap in record.itl:
        arrivals.append(arrivals[-1] + gap)
    if not record.itl_per_chunk:
        return [first] * max(1, record.completion_tokens - len(record.itl)) + arrivals[1:]
    n, tokens = len(arrivals), max(record.completion_tokens, len(arrivals))
    return [
        at for i, at in enumerate(arrivals) for _ in range(tokens * (i + 1) // n - tokens * i // n)
    ]


def peaks(ok: list[RequestRecord]) -> dict[str, float]:
    """bench_serving's `max_output_tokens_per_s` (the most tokens arriving within one whole
    second of the level) and `max_concurrent_requests` (the most requests running at some
    point of one whole second)."""
    tokens: dict[int, int] = {}
    running: dict[int, int] = {}
    for r in ok:
        for t in _token_times(r):
            tokens[int(t)] = tokens.get(int(t), 0) + 1
        for second in range(int(r.start), int(r.start + r.e2e) + 1):
            running[second] = running.get(second, 0) + 1
    return {
        "max_output_tokens_per_s": float(max(tokens.values(), default=0)),
        "max_concurrent_requests": max(running.values(), default=0),
    }


def details(records: list[RequestRecord]) -> dict[str, list[Any]]:
    """bench_serving's per-request arrays (`--output-details`), in request order."""
    return {
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.completion_tokens for r in records],
        "ttfts": [r.ttft for r in records],
        "itls": [r.itl for r in records],
        "errors": [r.error or "" for r in records],
    }


def _bench_serving_row(
    run: LevelRun, backend: str, ok: list[RequestRecord], failed: list[RequestRecord],
    duration: float,
) -> Figures:  # fmt: skip
    """The keys bench_serving writes, with its meanings."""
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    return {
        "backend": backend,
        "request_rate": run.request_rate if math.isfinite(run.request_rate) else "inf",
        "max_concurrency": run.concurrency,
        "sharegpt_output_len": None,
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "total_input_tokens": in_tokens,
        "total_input_text_tokens": in_tokens,
        "total_input_vision_tokens": 0,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "input_throughput": in_tokens / duration,
        "output_throughput": out_tokens / duration,
        "total_throughput": (in_tokens + out_tokens) / duration,
        **_stats("ttft_ms", per_request.series_values(ok, "ttft_ms")),
        **_stats("tpot_ms", per_request.series_values(ok, "tpot_ms")),
        **_stats("itl_ms", per_request.series_values(ok, "itl_ms")),
        **_stats("e2e_latency_ms", per_request.series_values(ok, "e2e_latency_ms")),
        "concurrency": sum(r.e2e for r in ok) / duration,
        # distinct messages; with --output-details `errors` becomes bench_serving's
        # per-request list ("" for a success) and the messages stay in error_messages
        "errors": sorted({r.error or "" for r in failed})[:20],
        "error_messages": sorted({r.error or "" for r in failed})[:20],
        **peaks(ok),
        "total_cached_tokens": sum(r.cached_tokens for r in ok),
        "cache_hit_rate": sum(r.cached_tokens for r in ok) / in_tokens if in_tokens else 0.0,
    }


def _per_request_speeds(ok: list[RequestRecord]) -> dict[str, float]:
    """Each request's own speed: end to end (tokens / e2e) and decoding alone ((tokens - 1)
    / (e2e - TTFT), TTFT left out)."""
    speeds = per_request.series_values(ok, "per_request_output_tps")
    decoding = per_request.series_values(ok, "per_request_decode_tps")
    return {
        "mean_per_request_output_tps": statistics.fmean(speeds) if speeds else 0.0,
        "median_per_request_output_tps": statistics.median(speeds) if speeds else 0.0,
        "p10_per_request_output_tps": percentile(speeds, 10),
        "median_per_request_decode_tps": statistics.median(decoding) if decoding else 0.0,
    }


def summarize(
    run: LevelRun,
    backend: str,
    extra: Figures | None = None,
    slo: dict[str, float] | None = None,
    with_details: bool = False,
) -> Figures:
    """One results.jsonl row, bench_serving's keys and meanings (request_rate as the string
    "inf" when unlimited: JSON has no Infinity), plus gpufleet's own figures."""
    ok = [r for r in run.records if r.ok]
    failed = [r for r in run.records if not r.ok]
    duration = run.duration or 1e-9
    if run.open_loop:  # latency from when each request was due: no coordinated omission
        ok = [_from_due(r) for r in ok]
    result = _bench_serving_row(run, backend, ok, failed, duration)
    result.update(_per_request_speeds(ok))
    if any(r.turn is not None for r in run.records):
        result["per_turn"] = per_turn(run.records)
    result.update(client_figures(run))
    result.update(acceptance(ok))
    result.update(token_counts(ok))
    result.update(steady.figures(run, _token_times))
    result.update(slos.goodput(run.records, duration, slo or {}))
    if with_details:
        result.update(details(run.records))
    result.update(extra or {})
    return result


def _from_due(record: RequestRecord) -> RequestRecord:
    """An open-loop request's latencies counted from when it was due, not from when this
    client got round to sending it (its dispatch lag is latency the user would see)."""
    lag = record.dispatch_lag
    if not lag:
        return record
    return dataclasses.replace(
        record, start=record.due, ttft=record.ttft + lag, e2e=record.e2e + lag
    )


def acceptance(ok: list[RequestRecord]) -> dict[str, float]:
    """Per-request speculative acceptance (tokens / verify steps) over the level: its spread
    says whether one average (server_info's) describes the requests. Absent without it."""
    lengths = [a for a in (r.accept_length for r in ok) if a is not None]
    if not lengths:
        return {}
    return {
        "p10_request_accept_length": percentile(lengths, 10),
        "median_request_accept_length": percentile(lengths, 50),
        "p90_request_accept_length": percentile(lengths, 90),
    }


def token_counts(ok: list[RequestRecord]) -> Figures:
    """Where the level's token counts came from (one source, else each with its requests),
    whether its ITL is per token, and one line where the sources disagreed, both figures
    (host/bench/tokencount.py). Absent for records without a source (bench_serving's)."""
    sources = collections.Counter(r.tokens_source for r in ok if r.tokens_source)
    if not sources:
        return {}
    ranked = sorted(
        sources,
        key=lambda s: (
            s not in tokencount.SOURCES,
            tokencount.SOURCES.index(s) if s in tokencount.SOURCES else 0,
        ),
    )
    out: Figures = {
        "output_tokens_source": ranked[0]
        if len(ranked) == 1
        else ", ".join(f"{s} in {sources[s]} of {len(ok)}" for s in ranked)
    }
    per_chunk = sum(1 for r in ok if r.itl_per_chunk)
    out["itl_basis"] = "token" if not per_chunk else "chunk"
    said = [r.tokens_note for r in ok if r.tokens_note]
    lines = [f"{len(said)} of {len(ok)} requests: {said[0]}"] if said else []
    if per_chunk:
        lines.append(
            f"ITL per chunk in {per_chunk} of {len(ok)} requests: the tokens each chunk "
            "carried were not knowable (no consistent per-chunk usage, no tokenizer count of "
            "each chunk's text)"
        )
    if lines:
        out["output_tokens_note"] = "; ".join(lines)
    return out


def client_figures(run: LevelRun) -> Figures:
    """The generator's own figures for the level and whether it was the bottleneck
    (host/bench/clientcert.py); with a schedule, the wait for a free slot on its own."""
    lags = [r.dispatch_lag for r in run.records if not r.skipped and r.start]
    e2e = [r.e2e for r in run.records if r.ok and r.e2e > 0]
    out: Figures = {}
    if run.client is not None and run.client.wall_s > 0:
        cores = run.client.cpu_s / run.client.wall_s
        lag_p99 = percentile(lags, 99) * 1000
        loop_p99 = percentile(run.client.loop_lags, 99) * 1000
        idle = statistics.fmean(lags) / statistics.fmean(e2e) if lags and e2e else 0.0
        out = {
            "client_procs": run.client.procs,
            "client_cpu_cores": round(cores, 3),
            "client_dispatch_lag_p50_ms": percentile(lags, 50) * 1000,
            "client_dispatch_lag_p99_ms": lag_p99,
            "client_loop_lag_p99_ms": loop_p99,
            "client_loop_lag_max_ms": max(run.client.loop_lags, default=0.0) * 1000,
            "client_idle_slot_share": idle,
            "client_bound": clientcert.verdict(run.client.busiest, idle, lag_p99),
            "client_late": clientcert.late(loop_p99),
        }
    if run.open_loop:
        out.update(_stats("queue_wait_ms", [r.queue_wait * 1000 for r in run.records if r.ok]))
        out.update(open_loop_rates(run.records))
    return out


def per_turn(records: list[RequestRecord]) -> list[TurnFigures]:
    """Multi-turn sessions, turn by turn: later turns resend the conversation, so their
    prompts grow and, with a prefix cache, most of each prompt is cached."""
    out: list[TurnFigures] = []
    for turn in sorted({r.turn for r in records if r.turn is not None}):
        ok = [r for r in records if r.turn == turn and r.ok]
        prompt = sum(r.prompt_tokens for r in ok)
        out.append(
            {
                "turn": turn + 1,
                "completed": len(ok),
                "failed": sum(1 for r in records if r.turn == turn and not r.ok),
                "mean_prompt_tokens": prompt / len(ok) if ok else 0.0,
                "cache_hit_rate": sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
                "mean_ttft_ms": statistics.fmean(r.ttft for r in ok) * 1000 if ok else 0.0,
                "median_ttft_ms": statistics.median(r.ttft for r in ok) * 1000 if ok else 0.0,
            }
        )
    return out
