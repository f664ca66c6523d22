"""Closed-loop load generator (asyncio, bench/httpstream.py), SGLang bench_serving's semantics.

One level = one concurrency cap (a semaphore, like `--max-concurrency`) and an optional
Poisson request rate (inf = all at once). Warm-up requests run first and are excluded.
Token counts come from the server (`completion_tokens` / `usage`), never from chunks: a
speculative server sends several tokens per chunk.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.host.bench.httpstream import StreamClient

BACKENDS = ("sglang", "openai", "openai-chat")
WARMUP_TOKENS = 16


@dataclass
class Prompt:
    text: str
    prompt_tokens: int = 0  # our estimate; the server's count wins when it reports one
    output_len: int = 128


@dataclass
class RequestRecord:
    index: int
    ok: bool = False
    error: str | None = None
    start: float = 0.0  # seconds since the level started (perf_counter based)
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chunks: int = 0
    rid: str | None = None
    skipped: bool = False  # not sent: the level's --duration had passed
    start_wall: float = 0.0  # time.time() at send, to compare with server-side clocks

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# completion_tokens from an SGLang stream chunk without decoding the cumulative text: the text
# grows with every chunk, so json.loads of each chunk costs O(length). meta_info comes after
# the text and a JSON string cannot hold an unescaped quote, so the last
# `"completion_tokens":` in the payload is the real key.
_COMPLETION = b'"completion_tokens":'
_COMPLETION_VALUE = re.compile(rb'"completion_tokens":\s*(\d+)')


def _payload(backend: str, prompt: Prompt, model: str, ignore_eos: bool) -> tuple[str, dict]:
    if backend == "sglang":
        return "/generate", {
            "text": prompt.text,
            "sampling_params": {
                "max_new_tokens": prompt.output_len,
                "temperature": 0.0,
                "ignore_eos": ignore_eos,
            },
            "stream": True,
        }
    common = {
        "model": model,
        "max_tokens": prompt.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    if backend == "openai":
        return "/v1/completions", {**common, "prompt": prompt.text}
    return "/v1/chat/completions", {
        **common,
        "messages": [{"role": "user", "content": prompt.text}],
    }


class _StreamTracker:
    """Turns one request's stream events into its record, at the time each event arrived.

    `on_event` runs once per streamed chunk inside the protocol's read callback, so the
    SGLang path is kept lean: after the first chunk, only `completion_tokens` is read.
    """

    def __init__(self, backend: str, record: RequestRecord, start: float) -> None:
        self.record = record
        self.start = start
        self.last = start
        self.seen_tokens = 0
        self.stopped = False  # an error event arrived: ignore the rest
        self.on_event = self._sglang_event if backend == "sglang" else self._openai_event

    def _sglang_event(self, payload: bytes, now: float) -> None:
        if self.stopped:
            return
        seen = self.seen_tokens
        at = payload.rfind(_COMPLETION) if seen else -1
        match = _COMPLETION_VALUE.match(payload, at) if at >= 0 else None
        if match is not None:
            total = int(match.group(1))
        else:  # the first chunk, [DONE], an error, or an unusual layout: parse it all
            if payload == b"[DONE]":
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                self._error(chunk)
                return
            record = self.record
            meta = chunk.get("meta_info") or {}
            total = int(meta.get("completion_tokens", seen + 1))
            record.prompt_tokens = int(meta.get("prompt_tokens", record.prompt_tokens))
            record.rid = meta.get("id", record.rid)
        new = total - seen
        if new <= 0:
            return
        record = self.record
        if seen == 0:
            record.ttft = now - self.start
        else:
            gap = (now - self.last) / new  # k tokens in one chunk = k gaps of 1/k
            record.itl.extend([gap] * new)
        self.seen_tokens = record.completion_tokens = total
        record.chunks += 1
        self.last = now

    def _openai_event(self, payload: bytes, now: float) -> None:
        if self.stopped or payload == b"[DONE]":
            return
        record = self.record
        chunk = json.loads(payload)
        if "error" in chunk:
            self._error(chunk)
            return
        usage = chunk.get("usage")
        if usage:
            record.prompt_tokens = int(usage.get("prompt_tokens", 0))
            self.seen_tokens = int(usage.get("completion_tokens", self.seen_tokens))
        choices = chunk.get("choices") or []
        if not choices:
            return
        c = choices[0]
        piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
        if not piece:
            return
        if record.chunks == 0:
            record.ttft = now - self.start
        else:
            record.itl.append(now - self.last)
        if not usage:
            self.seen_tokens += 1
        record.chunks += 1
        self.last = now

    def _error(self, chunk: dict[str, Any]) -> None:
        error = chunk["error"]
        self.record.error = str(error.get("message", error) if isinstance(error, dict) else error)
        self.stopped = True


async def _one_request(
    client: StreamClient,
    backend: str,
    prompt: Prompt,
    record: RequestRecord,
    model: str,
    ignore_eos: bool,
    t0: float,
    timeout: float,
) -> None:
    path, body = _payload(backend, prompt, model, ignore_eos)
    start = time.perf_counter()
    record.start_wall = time.time()
    record.start = start - t0
    record.prompt_tokens = prompt.prompt_tokens
    tracker = _StreamTracker(backend, record, start)
    try:
        response = await client.post_stream(path, body, tracker.on_event, timeout)
    except asyncio.CancelledError:
        record.error = "cancelled"
        raise
    except TimeoutError:
        record.error = f"timed out after {timeout:g}s"
        return
    except Exception as exc:  # connection refused or reset, server crash, bad JSON: kept
        record.error = f"{type(exc).__name__}: {exc}"
        return
    if response.status != 200:
        record.error = f"HTTP {response.status}: {response.text[:300].strip()}"
        return
    if record.error:
        return
    record.e2e = tracker.last - start
    record.completion_tokens = tracker.seen_tokens
    record.ok = tracker.seen_tokens > 0
    if not record.ok:
        record.error = "no tokens received" + (
            f": {response.text[:200].strip()}" if response.body else ""
        )


@dataclass
class LevelRun:
    concurrency: int
    request_rate: float
    duration: float
    records: list[RequestRecord]
    started_at: float  # wall clock, for slicing server logs
    warmup_errors: list[str] = field(default_factory=list)


async def _warm_up(
    client: StreamClient,
    prompts: list[Prompt],
    warmup: int,
    backend: str,
    model: str,
    ignore_eos: bool,
    request_timeout: float,
) -> list[str]:
    """Warm the connection pool and the server's path (16 tokens are enough); the errors."""
    errors = []
    for i in range(warmup):
        rec = RequestRecord(index=-1 - i)
        base = prompts[i % len(prompts)]
        short = Prompt(base.text, base.prompt_tokens, min(base.output_len, WARMUP_TOKENS))
        await _one_request(
            client, backend, short, rec, model, ignore_eos, time.perf_counter(), request_timeout
        )
        if not rec.ok:
            errors.append(rec.error or "failed")
    return errors


async def run_level(
    base_url: str,
    prompts: list[Prompt],
    concurrency: int,
    backend: str = "sglang",
    request_rate: float = float("inf"),
    warmup: int = 1,
    model: str = "",
    ignore_eos: bool = True,
    seed: int = 0,
    on_progress: Callable[[list[RequestRecord], float], None] | None = None,
    progress_every: float = 1.0,
    request_timeout: float = 3600.0,
    duration: float | None = None,
) -> LevelRun:
    client = StreamClient(base_url)
    try:
        warm_errors = await _warm_up(
            client, prompts, warmup, backend, model, ignore_eos, request_timeout
        )
        records = [RequestRecord(index=i) for i in range(len(prompts))]
        semaphore = asyncio.Semaphore(concurrency)
        rng = random.Random(seed)
        started_at = time.time()
        t0 = time.perf_counter()

        async def limited(i: int) -> None:
            async with semaphore:
                if duration is not None and time.perf_counter() - t0 >= duration:
                    records[i].skipped = True
                    return
                await _one_request(
                    client, backend, prompts[i], records[i], model, ignore_eos, t0, request_timeout
                )

        async def reporter() -> None:
            while True:
                await asyncio.sleep(progress_every)
                if on_progress:
                    on_progress(records, time.perf_counter() - t0)

        report_task = asyncio.create_task(reporter()) if on_progress else None
        tasks = []
        for i in range(len(prompts)):
            tasks.append(asyncio.create_task(limited(i)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
            if duration is not None and time.perf_counter() - t0 >= duration:
                for j in range(i + 1, len(prompts)):
                    records[j].skipped = True
                break
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        if report_task:
            report_task.cancel()
        if on_progress:
            on_progress(records, elapsed)
    finally:
        client.close()
    sent = [r for r in records if not r.skipped]
    return LevelRun(concurrency, request_rate, elapsed, sent, started_at, warm_errors)


def run_async(coro: Any) -> Any:
    """asyncio.run, on uvloop when the host has it (SGLang's venv does): less CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
