"""One request and one multi-turn session against a server, and the warm-up: the payload,
route and stream reader of each engine's dialect (dialects.py: the reader keeps what each
chunk carried and decides the count at the end, streamread.py), and the record each
request leaves. bench/loadgen.py decides when each is sent.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from gpufleet.host.bench.dialects import DIALECTS
from gpufleet.host.bench.httpstream import RequestBody, StreamClient
from gpufleet.host.bench.level import Prompt, RequestRecord
from gpufleet.records import BenchPlan

WARMUP_TOKENS = 16


USER_TURN = "\n\nUser: {}\n\nAssistant:"  # the text template of a multi-turn conversation


@dataclass(frozen=True)
class Sending:
    """How every request of a level is sent: the engine's dialect, the model name its API
    wants, whether the server is asked to ignore EOS (fixed output lengths), and how long one
    request may take. One value per level, so a sender takes it whole."""

    backend: str = BenchPlan.backend
    model: str = BenchPlan.model
    ignore_eos: bool = BenchPlan.ignore_eos
    timeout: float = 3600.0
    tokenizer: str | None = None  # the model's, to count tokens the server did not


def _payload(
    backend: str,
    prompt: Prompt,
    model: str,
    ignore_eos: bool,
    messages: list[dict[str, str]] | None = None,
) -> tuple[str, RequestBody]:
    """The route and request body of `backend`'s dialect (dialects.py); `messages` (a
    multi-turn conversation) is used by openai-chat, the others get it as one text."""
    dialect = DIALECTS[backend]
    return dialect.route, dialect.body(prompt, model, ignore_eos, messages)


async def one_request(
    client: StreamClient,
    sending: Sending,
    prompt: Prompt,
    record: RequestRecord,
    *,
    t0: float,
    messages: list[dict[str, str]] | None = None,
    keep_text: bool = False,
    due: float | None = None,
) -> None:
    """Send one request and fill its record: timings from `t0` (the level's start), its
    tokens from the best consistent source (tokencount.py), or the error that ended it."""
    backend, timeout = sending.backend, sending.timeout
    path, body = _payload(backend, prompt, sending.model, sending.ignore_eos, messages)
    start = time.perf_counter()
    record.start_wall = time.time()
    record.start = start - t0
    record.due = record.start if due is None else min(due, record.start)
    record.dispatch_lag = record.start - record.due
    record.prompt_tokens = prompt.prompt_tokens
    tracker = DIALECTS[backend].reader(record, start, prompt.output_len)
    try:
        # the whole request within `timeout`, its connecting too (post_stream's one
        # deadline): a run's job has an end (host/bench/jobend.py)
        response = await client.post_stream(path, body, tracker.read, timeout, tracker.on_typed)
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
    tracker.conclude(prompt.output_len, sending.tokenizer,
                     response.text[:200].strip() if response.body else "")  # fmt: skip
    if keep_text and record.ok:
        record.text = tracker.final_text()


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


async def run_session(
    client: StreamClient,
    sending: Sending,
    prompt: Prompt,
    records: list[RequestRecord],
    *,
    t0: float,
    due: float | None = None,
) -> None:
    """Run a session's turns in order; a failed turn ends the session (the rest are not
    sent, and count as failed: the conversation cannot go on without that answer)."""
    conversation = _Conversation(prompt.text)
    for turn, (user, record) in enumerate(zip(prompt.turns or [], records, strict=True)):
        conversation.ask(user)
        request = Prompt(conversation.text, output_len=prompt.output_len)
        await one_request(
            client, sending, request, record, t0=t0,
            messages=conversation.messages, keep_text=turn + 1 < len(records),
            due=due if turn == 0 else None,
        )  # fmt: skip
        if not record.ok:
            for rest in records[turn + 1 :]:
                rest.error = f"not sent: turn {turn + 1} of the session failed"
            return
        conversation.answer(record.text)
        record.text = ""


async def warm_up(
    client: StreamClient, prompts: list[Prompt], warmup: int, sending: Sending
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
        await one_request(client, sending, short, rec, t0=time.perf_counter())
        if not rec.ok:
            errors.append(rec.error or "failed")
    return errors
