"""One request and one multi-turn session against a server, and the warm-up: the payload in
each engine's dialect, the stream's tracker (tokens counted from the server, never from
chunks), and the record each request leaves. bench/loadgen.py decides when each is sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

from gpufleet.host.agent import bounded
from gpufleet.host.bench.dialects import DIALECTS
from gpufleet.host.bench.httpstream import RequestBody, StreamClient
from gpufleet.host.bench.level import Prompt, RequestRecord

WARMUP_TOKENS = 16


USER_TURN = "\n\nUser: {}\n\nAssistant:"  # the text template of a multi-turn conversation


@dataclass(frozen=True)
class Sending:
    """How every request of a level is sent: the engine's dialect, the model name its API
    wants, whether the server is asked to ignore EOS (fixed output lengths), and how long one
    request may take. One value per level, so a sender takes it whole."""

    backend: str = "sglang"
    model: str = ""
    ignore_eos: bool = True
    timeout: float = 3600.0


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
) -> tuple[str, RequestBody]:
    """The route and request body of `backend`'s dialect (dialects.py); `messages` (a
    multi-turn conversation) is used by openai-chat, the others get it as one text."""
    dialect = DIALECTS[backend]
    return dialect.route, dialect.body(prompt, model, ignore_eos, messages)


class _StreamTracker:
    """Turns one request's stream events into its record, at the time each event arrived.

    `on_event` runs once per streamed chunk inside the protocol's read callback, so the
    SGLang path is kept lean: after the first chunk, only `completion_tokens` is read.
    """

    def __init__(
        self, backend: str, record: RequestRecord, start: float, keep_text: bool = False,
        asked: int = 1 << 20,
    ) -> None:  # fmt: skip
        self.record = record
        # the tokens an answer may count (its record keeps a gap per token): a server that
        # counts more, or claims 10^9 in one chunk, is stopped there (host/agent/bounded.py)
        self.most = 2 * asked + bounded.ANSWER_SLACK
        self.start = start
        self.last = start
        self.seen_tokens = 0
        self.stopped = False  # an error event arrived: ignore the rest
        self.keep_text = keep_text  # a session's next turn needs this answer's text
        self.last_payload = b""
        self.draft_accepted: int | None = None  # llama.cpp's timings.draft_n_accepted
        self.done = False  # the stream's `[DONE]` arrived
        self.finish_reason = False  # an OpenAI chunk gave its finish_reason
        sglang = DIALECTS[backend].events == "sglang"
        self.on_event = self._sglang_event if sglang else self._openai_event

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

    def ended_as_the_protocol_says(self) -> bool:
        """Whether the stream ended the way its engine's protocol ends one: `[DONE]`, or a
        finish reason (OpenAI's in a choice; SGLang's in the last chunk's meta_info). A
        stream that stops without either was cut short, however cleanly its TCP closed."""
        if self.done or self.finish_reason:
            return True
        if not self.last_payload:
            return False
        try:
            meta = json.loads(self.last_payload).get("meta_info") or {}
        except (ValueError, AttributeError):
            return False
        return bool(meta.get("finish_reason"))

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
                self.done = True
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                self._error(chunk["error"])
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
        if total > self.most:
            self._over(total)
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
        if payload == b"[DONE]":
            self.done = True
        if self.stopped or self.done:
            return
        record = self.record
        chunk = json.loads(payload)
        if "error" in chunk:
            self._error(chunk["error"])
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
            self.finish_reason = self.finish_reason or bool(c.get("finish_reason"))
            piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
        if not piece:  # the role chunk, or the final usage-only chunk
            if usage:
                self.seen_tokens = max(seen, int(usage.get("completion_tokens", seen)))
                record.completion_tokens = self.seen_tokens
            return
        # With usage in every chunk (continuous_usage_stats) a chunk of k tokens counts as k
        # gaps of 1/k, like the sglang backend; a server that omits it gives one per chunk.
        total = int(usage["completion_tokens"]) if usage else seen + 1
        if total > self.most or (self.keep_text and len(record.text) > bounded.ANSWER_TEXT):
            self._over(total)
            return
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

    def _over(self, total: int) -> None:
        text = bounded.mib(bounded.ANSWER_TEXT)
        self._error(f"the answer went past {self.most} tokens (the server counted {total}) "
                    f"or {text} of text: the rest was ignored")  # fmt: skip

    def _error(self, error: object) -> None:
        """An error event: the server's message (its `error` object's, else the value)."""
        self.record.error = str(error.get("message", error) if isinstance(error, dict) else error)
        self.stopped = True


async def one_request(
    client: StreamClient,
    sending: Sending,
    prompt: Prompt,
    record: RequestRecord,
    t0: float,
    *,
    messages: list[dict[str, str]] | None = None,
    keep_text: bool = False,
    due: float | None = None,
) -> None:
    """Send one request and fill its record: timings from `t0` (the level's start), the
    tokens the server counted, or the error that ended it."""
    backend, timeout = sending.backend, sending.timeout
    path, body = _payload(backend, prompt, sending.model, sending.ignore_eos, messages)
    start = time.perf_counter()
    record.start_wall = time.time()
    record.start = start - t0
    record.due = record.start if due is None else min(due, record.start)
    record.dispatch_lag = record.start - record.due
    record.prompt_tokens = prompt.prompt_tokens
    tracker = _StreamTracker(backend, record, start, keep_text, prompt.output_len)
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
    elif not tracker.ended_as_the_protocol_says():
        record.ok = False
        record.error = f"stream ended early after {tracker.seen_tokens} tokens"


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
            client, sending, request, record, t0,
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
        await one_request(client, sending, short, rec, time.perf_counter())
        if not rec.ok:
            errors.append(rec.error or "failed")
    return errors
