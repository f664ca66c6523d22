"""Closed-loop load generator (asyncio, bench/httpstream.py), SGLang bench_serving's semantics.

One level = one concurrency cap (a semaphore, like `--max-concurrency`) and an optional
Poisson request rate (inf = all at once), or a trace's own timestamps. Warm-up requests run
first and are excluded. Token counts come from the server (`completion_tokens` / `usage`),
never from chunks: a speculative server sends several tokens per chunk.

A prompt is one request (text or token ids), or a multi-turn session: each turn sends the
whole conversation so far (the shared system prompt, every earlier user message and the
server's own earlier answers) plus the next user message; the cap then counts sessions.
Only the requests in flight exist as tasks, so memory follows the cap, not the total.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gpufleet.host.bench.clientcert import ClientClock
from gpufleet.host.bench.httpstream import StreamClient
from gpufleet.host.bench.level import LevelRun, Prompt, RequestRecord, Tally
from gpufleet.kinds import BACKENDS as BACKENDS  # declared once there
from gpufleet.wire import JsonObject

WARMUP_TOKENS = 16


USER_TURN = "\n\nUser: {}\n\nAssistant:"  # the text template of a multi-turn conversation


# completion_tokens from an SGLang stream chunk without decoding the cumulative text: the text
# grows with every chunk, so json.loads of each chunk costs O(length). meta_info comes after
# the text and a JSON string cannot hold an unescaped quote, so the last
# `"completion_tokens":` in the payload is the real key.
_COMPLETION = b'"completion_tokens":'
# SGLang's verify steps of a speculative request (in meta_info; 0.5.x name), read once from
# the last chunk
_VERIFY = b'"spec_verify_ct":'
_VERIFY_VALUE = re.compile(rb'"spec_verify_ct":\s*(\d+)')


def _completion_tokens(payload: bytes) -> int | None:
    """The chunk's completion_tokens, found from the end with plain scans (a regex match per
    streamed chunk cost twice as much); None for a layout this does not expect."""
    at = payload.rfind(_COMPLETION)
    if at < 0:
        return None
    at += len(_COMPLETION)
    end = payload.find(b",", at, at + 32)
    if end < 0:
        end = payload.find(b"}", at, at + 32)
        if end < 0:
            return None
    try:
        return int(payload[at:end])
    except ValueError:
        return None


def _payload(
    backend: str,
    prompt: Prompt,
    model: str,
    ignore_eos: bool,
    messages: list[dict[str, str]] | None = None,
) -> tuple[str, dict]:
    """The request body; `messages` (a multi-turn conversation) is used by openai-chat, the
    other backends get it as one text (see Session)."""
    if backend == "sglang":
        source = {"input_ids": prompt.input_ids} if prompt.input_ids else {"text": prompt.text}
        return "/generate", {
            **source,
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
        # usage in every chunk: how many tokens each chunk carried, for per-token ITL
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": ignore_eos,
    }
    if backend == "openai":
        return "/v1/completions", {**common, "prompt": prompt.input_ids or prompt.text}
    return "/v1/chat/completions", {
        **common,
        "messages": messages or [{"role": "user", "content": prompt.text}],
    }


class _StreamTracker:
    """Turns one request's stream events into its record, at the time each event arrived.

    `on_event` runs once per streamed chunk inside the protocol's read callback, so the
    SGLang path is kept lean: after the first chunk, only `completion_tokens` is read.
    """

    def __init__(
        self, backend: str, record: RequestRecord, start: float, keep_text: bool = False
    ) -> None:
        self.record = record
        self.start = start
        self.last = start
        self.seen_tokens = 0
        self.stopped = False  # an error event arrived: ignore the rest
        self.keep_text = keep_text  # a session's next turn needs this answer's text
        self.last_payload = b""
        self.draft_accepted: int | None = None  # llama.cpp's timings.draft_n_accepted
        self.on_event = self._sglang_event if backend == "sglang" else self._openai_event

    def spec_verify_ct(self) -> int | None:
        """The request's verify steps (None: not speculative): SGLang's count from its last
        chunk; from llama.cpp's server, its tokens less the draft tokens it accepted (each
        step yields the target's one token plus those accepted: 40 tokens with 32 accepted
        are 8 steps of 5)."""
        at = self.last_payload.rfind(_VERIFY)
        match = _VERIFY_VALUE.match(self.last_payload, at) if at >= 0 else None
        if match:
            return int(match.group(1))
        if self.draft_accepted is not None and self.seen_tokens > self.draft_accepted:
            return self.seen_tokens - self.draft_accepted
        return None

    def final_text(self) -> str:
        """The whole answer (SGLang's chunks carry the cumulative text: parse the last)."""
        if self.last_payload:
            try:
                return str(json.loads(self.last_payload).get("text", ""))
            except ValueError:
                return ""
        return self.record.text

    def _sglang_event(self, payload: bytes, now: float) -> None:
        if self.stopped:
            return
        seen = self.seen_tokens
        total = _completion_tokens(payload) if seen else None
        if total is None:  # the first chunk, [DONE], an error, or an unusual layout: parse it all
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
            record.cached_tokens = int(meta.get("cached_tokens") or 0)
            record.rid = meta.get("id", record.rid)
        self.last_payload = payload
        new = total - seen
        if new <= 0:
            return
        record = self.record
        if seen == 0:
            record.ttft = now - self.start
        elif new == 1:
            record.itl.append(now - self.last)
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
        timings = chunk.get("timings")  # llama.cpp's server, on its last chunk
        if isinstance(timings, dict) and isinstance(timings.get("draft_n_accepted"), int):
            self.draft_accepted = timings["draft_n_accepted"]
        seen = self.seen_tokens
        if usage:
            record.prompt_tokens = int(usage.get("prompt_tokens", 0))
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = int(details.get("cached_tokens") or record.cached_tokens)
        choices = chunk.get("choices") or []
        piece = None
        if choices:
            c = choices[0]
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
        if not piece:  # the role chunk, or the final usage-only chunk
            if usage:
                self.seen_tokens = max(seen, int(usage.get("completion_tokens", seen)))
                record.completion_tokens = self.seen_tokens
            return
        # With usage in every chunk (continuous_usage_stats) a chunk of k tokens counts as k
        # gaps of 1/k, like the sglang backend; a server that omits it gives one per chunk.
        total = int(usage["completion_tokens"]) if usage else seen + 1
        new = max(1, total - seen)
        if record.chunks == 0:
            record.ttft = now - self.start
        else:
            record.itl.extend([(now - self.last) / new] * new)
        # counted as they arrive, as the sglang backend does: the live progress counts
        # tokens of requests in flight (it read 0 tok/s between finished requests)
        self.seen_tokens = record.completion_tokens = max(total, seen + 1)
        if self.keep_text:
            record.text += piece
        record.chunks += 1
        self.last = now

    def _error(self, chunk: JsonObject) -> None:
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
    messages: list[dict[str, str]] | None = None,
    keep_text: bool = False,
    due: float | None = None,
) -> None:
    path, body = _payload(backend, prompt, model, ignore_eos, messages)
    start = time.perf_counter()
    record.start_wall = time.time()
    record.start = start - t0
    record.due = record.start if due is None else min(due, record.start)
    record.dispatch_lag = record.start - record.due
    record.prompt_tokens = prompt.prompt_tokens
    tracker = _StreamTracker(backend, record, start, keep_text)
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
    record.spec_verify_ct = tracker.spec_verify_ct()
    record.ok = tracker.seen_tokens > 0
    if keep_text:
        record.text = tracker.final_text()
    if not record.ok:
        record.error = "no tokens received" + (
            f": {response.text[:200].strip()}" if response.body else ""
        )


class _Conversation:
    """One multi-turn session's growing conversation, as text and as chat messages."""

    def __init__(self, system: str) -> None:
        self.text = system
        self.messages = [{"role": "system", "content": system}] if system else []

    def ask(self, user: str) -> None:
        self.text += USER_TURN.format(user)
        self.messages.append({"role": "user", "content": user})

    def answer(self, reply: str) -> None:
        self.text += reply
        self.messages.append({"role": "assistant", "content": reply})


async def _session(
    client: StreamClient,
    backend: str,
    prompt: Prompt,
    records: list[RequestRecord],
    model: str,
    ignore_eos: bool,
    t0: float,
    timeout: float,
    due: float | None = None,
) -> None:
    """Run a session's turns in order; a failed turn ends the session (the rest are not
    sent, and count as failed: the conversation cannot go on without that answer)."""
    conversation = _Conversation(prompt.text)
    for turn, (user, record) in enumerate(zip(prompt.turns or [], records, strict=True)):
        conversation.ask(user)
        request = Prompt(conversation.text, output_len=prompt.output_len)
        await _one_request(
            client, backend, request, record, model, ignore_eos, t0, timeout,
            messages=conversation.messages, keep_text=turn + 1 < len(records),
            due=due if turn == 0 else None,
        )  # fmt: skip
        if not record.ok:
            for rest in records[turn + 1 :]:
                rest.error = f"not sent: turn {turn + 1} of the session failed"
            return
        conversation.answer(record.text)
        record.text = ""


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
        text = base.text + USER_TURN.format(base.turns[0]) if base.turns else base.text
        short = Prompt(
            text, base.prompt_tokens, min(base.output_len, WARMUP_TOKENS), base.input_ids
        )
        await _one_request(
            client, backend, short, rec, model, ignore_eos, time.perf_counter(), request_timeout
        )
        if not rec.ok:
            errors.append(rec.error or "failed")
    return errors


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
    on_progress: Callable[[Tally, float], None] | None = None,
    progress_every: float = 1.0,
    request_timeout: float = 3600.0,
    duration: float | None = None,
    after_warmup: Callable[[], Any] | None = None,
    headers: dict[str, str] | None = None,
    start_at: Callable[[], Awaitable[float]] | None = None,
) -> LevelRun:
    """Send every prompt, at most `concurrency` at once (sessions for multi-turn prompts).

    Arrivals: all at once, Poisson at `request_rate`, or each prompt's own `at` (a trace).
    A prompt waits for a free slot and then for its arrival time, so a late slot sends it
    at once, as bench_serving's queue of arrived requests does. `after_warmup` runs between
    the warm-up and the level (bench_serving flushes the prefix cache there). `headers` go
    with every request (the server's API key). `start_at`, when given, is awaited after the
    warm-up and returns the perf_counter instant the level starts at (several generator
    processes agree on one: host/bench/spread.py).
    """
    client = StreamClient(base_url, headers=headers)
    try:
        warm_errors = await _warm_up(
            client, prompts, warmup, backend, model, ignore_eos, request_timeout
        )
        after = await asyncio.to_thread(after_warmup) if after_warmup else None
        grouped = _records_for(prompts)
        records = [r for group in grouped for r in group]
        slots = asyncio.Semaphore(concurrency)
        freed: collections.deque[float] = collections.deque()  # when each slot came free
        rng = random.Random(seed)
        open_loop = request_rate != float("inf") or any(p.at is not None for p in prompts)
        if start_at is not None:
            t0 = await start_at()
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        clock = ClientClock()
        loop_watch = asyncio.create_task(clock.watch_loop())
        started_at = time.time()
        t0 = t0 if start_at is not None else time.perf_counter()
        in_flight: set[asyncio.Task] = set()

        crashes: list[BaseException] = []

        def finished(task: asyncio.Task) -> None:
            in_flight.discard(task)
            if not task.cancelled() and task.exception() is not None:
                crashes.append(task.exception())  # type: ignore[arg-type]

        def past_duration() -> bool:
            return duration is not None and time.perf_counter() - t0 >= duration

        async def send(i: int, due: float) -> None:
            try:
                prompt, group = prompts[i], grouped[i]
                if prompt.turns:
                    await _session(
                        client, backend, prompt, group, model, ignore_eos, t0, request_timeout,
                        due,
                    )  # fmt: skip
                else:
                    await _one_request(
                        client, backend, prompt, group[0], model, ignore_eos, t0,
                        request_timeout, due=due,
                    )  # fmt: skip
            finally:
                freed.append(time.perf_counter() - t0)
                slots.release()

        async def reporter() -> None:
            while True:
                await asyncio.sleep(progress_every)
                if on_progress:
                    on_progress(Tally.of(records), time.perf_counter() - t0)

        report_task = asyncio.create_task(reporter()) if on_progress else None
        arrival = 0.0
        for i, prompt in enumerate(prompts):
            if prompt.at is not None:
                arrival = prompt.at
            elif request_rate != float("inf") and i:
                arrival += rng.expovariate(request_rate)
            await slots.acquire()
            # a slot freed by a finished request: due from that moment (closed loop), or
            # from the arrival if that is later; an initial slot: due at once
            slot_at = freed.popleft() if freed else time.perf_counter() - t0
            wait = arrival - (time.perf_counter() - t0)
            if wait > 0:
                await asyncio.sleep(wait)
            if past_duration():
                slots.release()
                for group in grouped[i:]:
                    for record in group:
                        record.skipped = True
                break
            due = max(arrival, slot_at) if open_loop else slot_at
            if open_loop:
                for record in grouped[i][:1]:
                    record.queue_wait = max(0.0, slot_at - arrival)
            task = asyncio.create_task(send(i, due))
            in_flight.add(task)
            task.add_done_callback(finished)
        if in_flight:
            await asyncio.gather(*in_flight)
        if crashes:  # the generator itself failed (not a request: those are recorded)
            raise crashes[0]
        elapsed = time.perf_counter() - t0
        clock.stop()
        loop_watch.cancel()
        if report_task:
            report_task.cancel()
        if on_progress:
            on_progress(Tally.of(records), elapsed)
    finally:
        client.close()
    sent = [r for r in records if not r.skipped]
    return LevelRun(
        concurrency, request_rate, elapsed, sent, started_at, warm_errors, after, clock, open_loop
    )


def run_async(coro: Any) -> Any:
    """asyncio.run, on uvloop when the host has it (SGLang's venv does): less CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
