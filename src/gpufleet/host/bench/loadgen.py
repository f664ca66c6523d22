"""Closed-loop load generator (asyncio, bench/httpstream.py), SGLang bench_serving's semantics.

One level = one concurrency cap (a semaphore, like `--max-concurrency`) and an optional
Poisson request rate (inf = all at once), or a trace's own timestamps. Warm-up requests run
first and are excluded. Token counts come from the server's counts where consistent, else
the model's tokenizer, and from the chunks only as a marked approximation (tokencount.py):
a speculative server sends several tokens per chunk.

A prompt is one request (text or token ids), or a multi-turn session: each turn sends the
whole conversation so far (the shared system prompt, every earlier user message and the
server's own earlier answers) plus the next user message; the cap then counts sessions.
Only the requests in flight exist as tasks, so memory follows the cap, not the total.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.host.bench.clientcert import ClientClock
from gpufleet.host.bench.httpstream import StreamClient
from gpufleet.host.bench.level import LevelRun, Prompt, RequestRecord, Tally
from gpufleet.host.bench.sender import Sending, one_request, run_session, warm_up
from gpufleet.records import BenchPlan as PLAN  # the defaults a plan declares
from gpufleet.wire import carried


@dataclass(frozen=True)
class LevelSpec:
    """How a level sends, apart from its prompts and cap: the dialect and model, the
    arrivals (all at once, or Poisson at `request_rate`), the warm-up, the seed, an optional
    time limit and the headers (the server's API key). Plain values, so the spread's child
    processes receive it whole (host/bench/spread.py)."""

    backend: str = PLAN.backend
    request_rate: float = float("inf")
    warmup: int = PLAN.warmup
    model: str = PLAN.model
    ignore_eos: bool = PLAN.ignore_eos
    seed: int = PLAN.seed
    request_timeout: float = PLAN.request_timeout
    duration: float | None = None
    headers: dict[str, str] | None = None
    tokenizer: str | None = None  # the model's path: tokens counted where the server did not

    def sending(self) -> Sending:
        """What each request of the level is sent with."""
        return carried(Sending, self, timeout=self.request_timeout)


@dataclass(frozen=True)
class LevelHooks:
    """What a level calls out to while it runs: progress every `progress_every` seconds,
    a step between the warm-up and the level (bench_serving flushes the prefix cache there),
    and `start_at`, awaited after the warm-up, which returns the perf_counter instant the
    level starts at (several generator processes agree on one: host/bench/spread.py)."""

    on_progress: Callable[[Tally, float], None] | None = None
    progress_every: float = 1.0
    after_warmup: Callable[[], Any] | None = None
    start_at: Callable[[], Awaitable[float]] | None = None


DEFAULT_SPEC = LevelSpec()  # bench_serving's defaults: all at once, one warm-up request
NO_HOOKS = LevelHooks()


def _records_for(prompts: list[Prompt]) -> list[list[RequestRecord]]:
    """One record per request: a session gets one per turn."""
    out, index = [], 0
    for number, prompt in enumerate(prompts):
        if prompt.turns:
            out.append(
                [
                    RequestRecord(index=index + t, session=number, turn=t)
                    for t in range(len(prompt.turns))
                ]
            )
        else:
            out.append([RequestRecord(index=index)])
        index += prompt.requests
    return out


class _Dispatch:
    """One level's sending: the slots of the cap, each prompt's arrival, the requests in
    flight (only those exist as tasks) and the records they fill."""

    def __init__(
        self, client: StreamClient, prompts: list[Prompt], concurrency: int, sending: Sending
    ) -> None:
        self.client, self.prompts, self.sending = client, prompts, sending
        self.grouped = _records_for(prompts)
        self.records = [r for group in self.grouped for r in group]
        self.slots = asyncio.Semaphore(concurrency)
        self.freed: collections.deque[float] = collections.deque()  # when each slot came free
        self.in_flight: set[asyncio.Task] = set()
        self.crashes: list[BaseException] = []
        self.t0 = 0.0

    def _finished(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.crashes.append(task.exception())  # type: ignore[arg-type]

    async def _send(self, i: int, due: float) -> None:
        try:
            prompt, group = self.prompts[i], self.grouped[i]
            if prompt.turns:
                await run_session(self.client, self.sending, prompt, group, t0=self.t0, due=due)
            else:
                await one_request(self.client, self.sending, prompt, group[0], t0=self.t0, due=due)
        finally:
            self.freed.append(time.perf_counter() - self.t0)
            self.slots.release()

    async def report(self, on_progress: Callable[[Tally, float], None], every: float) -> None:
        while True:
            await asyncio.sleep(every)
            on_progress(Tally.of(self.records), time.perf_counter() - self.t0)

    async def run(
        self, request_rate: float, seed: int, duration: float | None, open_loop: bool
    ) -> None:
        """Send each prompt when a slot is free and it has arrived; stop sending past
        `duration` (the rest are skipped); wait for what is in flight."""
        rng = random.Random(seed)
        arrival = 0.0
        for i, prompt in enumerate(self.prompts):
            if prompt.at is not None:
                arrival = prompt.at
            elif request_rate != float("inf") and i:
                arrival += rng.expovariate(request_rate)
            await self.slots.acquire()
            # a slot freed by a finished request: due from that moment (closed loop), or
            # from the arrival if that is later; an initial slot: due at once
            slot_at = self.freed.popleft() if self.freed else time.perf_counter() - self.t0
            wait = arrival - (time.perf_counter() - self.t0)
            if wait > 0:
                await asyncio.sleep(wait)
            if duration is not None and time.perf_counter() - self.t0 >= duration:
                self.slots.release()
                for group in self.grouped[i:]:
                    for record in group:
                        record.skipped = True
                break
            due = max(arrival, slot_at) if open_loop else slot_at
            if open_loop:
                for record in self.grouped[i][:1]:
                    record.queue_wait = max(0.0, slot_at - arrival)
            task = asyncio.create_task(self._send(i, due))
            self.in_flight.add(task)
            task.add_done_callback(self._finished)
        if self.in_flight:
            await asyncio.gather(*self.in_flight)
        if self.crashes:  # the generator itself failed (not a request: those are recorded)
            raise self.crashes[0]


async def run_level(
    base_url: str,
    prompts: list[Prompt],
    concurrency: int,
    spec: LevelSpec = DEFAULT_SPEC,
    hooks: LevelHooks = NO_HOOKS,
) -> LevelRun:
    """Send every prompt, at most `concurrency` at once (sessions for multi-turn prompts).

    Arrivals: all at once, Poisson at `spec.request_rate`, or each prompt's own `at` (a
    trace). A prompt waits for a free slot and then for its arrival time, so a late slot
    sends it at once, as bench_serving's queue of arrived requests does.
    """
    client = StreamClient(base_url, headers=spec.headers)
    try:
        warm_errors = await warm_up(client, prompts, spec.warmup, spec.sending())
        after = await asyncio.to_thread(hooks.after_warmup) if hooks.after_warmup else None
        level = _Dispatch(client, prompts, concurrency, spec.sending())
        open_loop = spec.request_rate != float("inf") or any(p.at is not None for p in prompts)
        if hooks.start_at is not None:
            t0 = await hooks.start_at()
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        clock = ClientClock()
        loop_watch = asyncio.create_task(clock.watch_loop())
        started_at = time.time()
        level.t0 = t0 if hooks.start_at is not None else time.perf_counter()
        on_progress = hooks.on_progress
        reporter = level.report(on_progress, hooks.progress_every) if on_progress else None
        report_task = asyncio.create_task(reporter) if reporter else None
        await level.run(spec.request_rate, spec.seed, spec.duration, open_loop)
        elapsed = time.perf_counter() - level.t0
        clock.stop()
        loop_watch.cancel()
        if report_task:
            report_task.cancel()
        if on_progress:
            on_progress(Tally.of(level.records), elapsed)
    finally:
        client.close()
    sent = [r for r in level.records if not r.skipped]
    return LevelRun(
        concurrency, spec.request_rate, elapsed, sent, started_at, warm_errors, after, clock,
        open_loop,
    )  # fmt: skip


def run_async(coro: Any) -> Any:
    """asyncio.run, on uvloop when the host has it (SGLang's venv does): less CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
