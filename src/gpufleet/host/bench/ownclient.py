"""gpufleet's own load generator as a bench client (`--engine gpufleet`): a level through
host/bench/loadgen.py (one process, or spread over several: host/bench/spread.py), with
the server's Prometheus samples, its /server_info and its live progress events; the
level's figures from its request records (host/bench/metrics.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import time
from datetime import UTC, datetime
from typing import Any

from gpufleet.host.bench import serverapi
from gpufleet.host.bench.clientapi import (
    REQUESTS_FAILED,
    BenchRun,
    LevelOutcome,
    level_tail,
    prompt_of,
    telemetry_for,
)
from gpufleet.host.bench.level import Prompt, Tally, salted
from gpufleet.host.bench.loadgen import LevelHooks, LevelSpec, run_async, run_level
from gpufleet.host.bench.metrics import summarize
from gpufleet.host.bench.rundir import RunWriter, depth_switches, log_size
from gpufleet.host.bench.spread import auto_procs, run_spread
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server import listener
from gpufleet.records import BenchPlan, Figures, Level, ResultRow
from gpufleet.wire import carried

RATE_WINDOW_S = 3.0  # the live tok/s: tokens over about this many seconds


def client_procs(plan: BenchPlan, level: Level, last: ResultRow | None) -> int:
    """How many generator processes a level gets: `--client-procs N`, or `auto` from the
    previous level's measured CPU per token and token rate (the first level: one)."""
    if plan.client_procs != "auto":
        return max(1, int(plan.client_procs))
    if last is None:
        return 1
    return auto_procs(
        last.output_throughput, last.client_cpu_cores, level.concurrency, last.max_concurrency
    )


class _LiveProgress:
    """A level's progress events: requests done, tok/s over the last few seconds (tokens
    arrive in bursts) and the time left."""

    def __init__(
        self, plan: BenchPlan, prompts: list[Prompt], concurrency: int, writer: RunWriter
    ) -> None:
        self.plan, self.concurrency, self.writer = plan, concurrency, writer
        self.total = sum(p.requests for p in prompts)
        self.recent: collections.deque[tuple[float, int]] = collections.deque(
            [(time.perf_counter(), 0)]
        )
        # With ignore_eos every request streams exactly output_len tokens, so tokens
        # received say how far the level is; counting finished requests would not (at C=64
        # the first 64 all finish together, and after the first one the estimate read
        # ~1,300 s).
        expected = sum(p.output_len * p.requests for p in prompts)
        self.expected_tokens = expected if plan.ignore_eos else 0

    def _rate(self, tokens: int) -> float:
        now = time.perf_counter()
        while len(self.recent) > 1 and now - self.recent[1][0] >= RATE_WINDOW_S:
            self.recent.popleft()
        then, before = self.recent[0]
        self.recent.append((now, tokens))
        return (tokens - before) / max(1e-6, now - then)

    def _eta(self, tally: Tally, elapsed: float) -> float | None:
        if self.plan.duration:
            return max(0.0, self.plan.duration - elapsed)
        if self.expected_tokens and tally.tokens:
            return elapsed * max(0, self.expected_tokens - tally.tokens) / tally.tokens
        done = tally.done
        return (elapsed / done) * (self.total - done) if done else None

    def __call__(self, tally: Tally, elapsed: float) -> None:
        rate = self._rate(tally.tokens)  # in-flight requests too
        eta = self._eta(tally, elapsed)
        self.writer.event(
            {
                "level": self.concurrency,
                "done": tally.done,
                "total": self.total,
                "errors": tally.errors,
                "tok_s": round(rate, 1),
                "elapsed_s": round(elapsed, 1),
                "eta_s": round(eta, 1) if eta is not None else None,
            }
        )


async def _level(
    plan: BenchPlan, prompts: list[Prompt], level: Level, writer: RunWriter,
    *, keys: dict[str, str], procs: int = 1,
) -> tuple[Any, list[serverapi.MetricSample]]:  # fmt: skip
    progress = _LiveProgress(plan, prompts, level.concurrency, writer)
    samples: list[serverapi.MetricSample] = []
    stop = asyncio.Event()
    sampler = None
    if plan.metrics_url:
        sampler = asyncio.create_task(
            serverapi.sample_metrics(plan.metrics_url, samples, stop, keys, plan.metric_names)
        )
    generate = run_level if procs == 1 else functools.partial(run_spread, procs)
    spec = carried(  # the plan's fields the level sends with, by name
        LevelSpec,
        plan,
        request_rate=plan.request_rate or float("inf"),
        headers=serverkeys.headers(keys),
    )
    flush = (lambda: serverapi.flush_cache(plan.base_url, keys)) if plan.flush_cache else None
    hooks = LevelHooks(on_progress=progress, after_warmup=flush)
    run = await generate(plan.base_url, prompts, level.concurrency, spec=spec, hooks=hooks)
    stop.set()
    if sampler:
        await sampler
    return run, samples


def _accept_length(reported: float | None, run: Any) -> float | None:
    """SGLang's average speculative acceptance length from /server_info, when it has one;
    else the level's requests' own (their tokens over their verify steps, pooled: from
    llama.cpp's per-response timings), so a drafting engine without SGLang's endpoint does
    not read like one that never drafts."""
    if reported is not None:
        return reported
    drafted = [r for r in run.records if r.ok and r.spec_verify_ct]
    steps = sum(r.spec_verify_ct for r in drafted)
    return sum(r.completion_tokens for r in drafted) / steps if steps else None


def _summary(
    plan: BenchPlan,
    run: Any,
    samples: list[serverapi.MetricSample],
    flushed: bool | None,
    keys: dict[str, str],
) -> Figures:
    """One results.jsonl row: bench_serving's figures plus Prometheus maxima and means."""
    info = serverapi.server_info(plan.base_url, keys)
    summary = summarize(
        run,
        plan.backend,
        {
            "dataset_name": plan.prompt_set,
            "tag": plan.profile,
            "seed": plan.seed,
            "output_len": plan.output_len,
            **random_lengths(plan),
            "accept_length": _accept_length(serverapi.accept_length(info), run),
            "server_info": info,
            "started_at": datetime.fromtimestamp(run.started_at, UTC).isoformat(),
            "warmup_errors": run.warmup_errors,
            "cache_flushed": flushed,
            "prompts_salted": plan.salt_prompts or None,
        },
        slo=plan.slo,
        with_details=bool(plan.output_details),
    )
    for key in serverapi.PROM_KEYS:
        vals = [s[key] for s in samples if key in s]
        if vals:
            summary[f"prom_{key.split(':')[1]}_max"] = max(vals)
            summary[f"prom_{key.split(':')[1]}_mean"] = sum(vals) / len(vals)
    return summary


def random_lengths(plan: BenchPlan) -> Figures:
    """bench_serving's random_* keys: the lengths of a random-ids set, else None."""
    random = plan.random
    return {
        "random_input_len": random["input_len"] if random else None,
        "random_output_len": random["output_len"] if random else None,
        "random_range_ratio": random["range_ratio"] if random else None,
    }


def bench_level(run: BenchRun, level: Level) -> LevelOutcome:
    """Run one level with gpufleet's generator and write its files."""
    plan, writer, keys = run.plan, run.writer, run.keys
    server_state, marks = run.server_state, run.marks
    c = level.concurrency
    prompts = [prompt_of(plan, row) for row in run.rows[: level.num_prompts]]
    if plan.salt_prompts:
        prompts = salted(prompts, f"[{plan.run_id[-6:]} {level.tag}] ")
    gauge = telemetry_for(run, level)
    try:
        with gauge or contextlib.nullcontext():
            procs = client_procs(plan, level, writer.last)
            measured, samples = run_async(
                _level(plan, prompts, level, writer, keys=keys, procs=procs)
            )
    except Exception as exc:  # the generator itself failed: keep what we know
        return LevelOutcome("failed", f"level C={c}: load generator error: {exc!r}", True)
    begun = marks[-1][0]
    marks.append((log_size(server_state), f"level C={c} ends"))
    refused = listener.refusal_for(server_state)  # its /server_info carries the key
    if refused:
        return LevelOutcome("failed", refused, True)
    summary = _summary(plan, measured, samples, measured.after_warmup, keys)
    if (summary.get("server_info") or {}).get("speculative_adaptive"):
        summary["depth_switches"] = depth_switches(server_state, begun, marks[-1][0])
    if samples:
        writer.lines(f"metrics-{level.tag}.jsonl", samples)
    writer.lines(f"requests-{level.tag}.jsonl", [r.to_json() for r in measured.records])
    row, alive = level_tail(summary, level, run, gauge)
    if not alive:
        return LevelOutcome("failed", f"the server process exited during level C={c}", True)
    if row.failed:
        return LevelOutcome(
            "failed", f"{REQUESTS_FAILED}: first at C={c}: {row.error_messages[:1]}", False
        )
    return LevelOutcome("done", None, False)
