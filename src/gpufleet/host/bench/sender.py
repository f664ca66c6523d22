"""One request and one multi-turn session against a server, and the warm-up: the payload in
each engine's dialect, the stream's tracker (what each chunk carried; the count decided at
the end from the best consistent source, tokencount.py), and the record each request
leaves. bench/loadgen.py decides when each is sent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.host.agent import bounded
from gpufleet.host.bench import tokencount
from gpufleet.host.bench.dialects import DIALECTS, Finish, error_of, event_error, outcome
from gpufleet.host.bench.httpstream import RequestBody, StreamClient
from gpufleet.host.bench.level import Prompt, RequestRecord
from gpufleet.host.bench.tokencount import Seen, decide

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
    tokenizer: str | None = None  # the model's, to count tokens the server did not


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
    SGLang path is kept lean: after the first chunk, only `completion_tokens` is read. What
    each chunk carried is kept (`seen`); the count and the gaps are decided at the end
    (tokencount.py), and how the stream ended by its dialect (dialects.py).
    """

    def __init__(
        self, backend: str, record: RequestRecord, start: float, asked: int = 1 << 20
    ) -> None:
        self.record = record
        # the tokens an answer may count (its record keeps a gap per token): a server that
        # counts more, or claims 10^9 in one chunk, is stopped there (host/agent/bounded.py)
        self.most = 2 * asked + bounded.ANSWER_SLACK
        self.text_kept = 0  # characters of the answer's pieces kept, bounded likewise
        self.start = start
        self.last = start
        self.seen_tokens = 0  # the running count, for the live progress
        self.stopped = False  # an error event arrived: ignore the rest
        self.last_payload = b""
        self.draft_accepted: int | None = None  # llama.cpp's timings.draft_n_accepted
        self.done = False  # the stream's `[DONE]` arrived
        self.finish: Finish | None = None  # the finish reason, as the dialect reads it
        self.dialect = DIALECTS[backend]
        sglang = self.dialect.events == "sglang"
        self.seen = Seen(pieces=None if sglang else [], text=self.final_text)
        self._text = ""  # SGLang's cumulative text so far, where its chunks have no count
        self.on_event = self._guarded(self._sglang_event if sglang else self._openai_event)

    def _guarded(self, handler: Callable[[bytes, float], None]) -> Callable[[bytes, float], None]:
        """The chunk handler, with a chunk it could not read (a hostile server's shapes the
        parsers did not foresee) failing the request, said, instead of raising in the read
        callback, where it left the request waiting for its timeout."""

        def on_event(payload: bytes, now: float) -> None:
            try:
                handler(payload, now)
            except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
                self._error(f"a chunk gpufleet could not read ({type(e).__name__}): "
                            f"{payload[:120].decode(errors='replace')}")  # fmt: skip

        return on_event

    def spec_verify_ct(self, tokens: int | None = None) -> int | None:
        """The request's verify steps (None: not speculative): SGLang's count from its last
        chunk; from llama.cpp's server, its tokens less the draft tokens it accepted (each
        step yields the target's one token plus those accepted: 40 tokens with 32 accepted
        are 8 steps of 5)."""
        at = self.last_payload.rfind(_VERIFY)
        match = _VERIFY_VALUE.match(self.last_payload, at) if at >= 0 else None
        if match:
            return int(match.group(1))
        tokens = self.seen_tokens if tokens is None else tokens
        if self.draft_accepted is not None and tokens > self.draft_accepted:
            return tokens - self.draft_accepted
        return None

    def ending(self) -> str | None:
        """Why the stream failed the request by how it ended (dialects.outcome), else None.
        SGLang's finish reason is in its last chunk's meta_info, read once here."""
        if self.last_payload and self.finish is None:
            chunk = self._parse(self.last_payload)
            self.finish = self.dialect.finish(chunk) if isinstance(chunk, dict) else None
        return outcome(self.done, self.finish, self.seen_tokens)

    def final_text(self) -> str:
        """The whole answer (SGLang's chunks carry the cumulative text: parse the last)."""
        if self.seen.pieces is not None:
            return "".join(self.seen.pieces)
        chunk = self._parse(self.last_payload) if self.last_payload else None
        return str(chunk.get("text", "")) if isinstance(chunk, dict) else ""

    def on_typed(self, kind: bytes, payload: bytes, now: float) -> None:
        """An event of its own type: `event: error` fails the request; others are data."""
        if kind == b"error":
            self._error(event_error(payload))
        else:
            self.on_event(payload, now)

    def _parse(self, payload: bytes) -> object:
        try:
            return json.loads(payload)
        except ValueError:
            return payload.decode(errors="replace")

    def _sglang_event(self, payload: bytes, now: float) -> None:
        if self.stopped:
            return
        seen = self.seen_tokens
        counted = seen and self.seen.pieces is None  # SGLang's way: a count on every chunk
        count = _completion_tokens(payload) if counted else None
        new = 0 if count is None else count - seen
        if count is None:  # the first chunk, [DONE], an error, an unusual layout: parse it all
            if payload == b"[DONE]":
                self.done = True
                return
            parsed = self._sglang_chunk(payload, seen)
            if parsed is None:
                return
            count, new = parsed
        self.last_payload = payload
        if new <= 0:
            return
        if seen + new > self.most or self.text_kept > bounded.ANSWER_TEXT:
            self._over(seen + new)
            return
        if seen == 0:
            self.record.ttft = now - self.start
        self.seen.arrivals.append(now)
        self.seen.counts.append(count)
        self.seen.usage = count if count is not None else self.seen.usage
        self.seen_tokens = self.record.completion_tokens = seen + new
        self.record.chunks += 1
        self.last = now

    def _sglang_chunk(self, payload: bytes, seen: int) -> tuple[int | None, int] | None:
        """A chunk read whole: (its count, the tokens it adds), None for an error. A stream
        whose first chunk has no count is read chunk by chunk from its cumulative text: a
        chunk that adds text carries at least one token, and its piece is kept for the
        tokenizer; a count after such chunks is their final count."""
        chunk = self._parse(payload)
        error = error_of(chunk)
        if error or not isinstance(chunk, dict):
            self._error(error or "not a JSON object")
            return None
        record = self.record
        meta = chunk.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        count = _int(meta.get("completion_tokens"))
        record.prompt_tokens = _count(meta.get("prompt_tokens"), record.prompt_tokens)
        record.cached_tokens = _count(meta.get("cached_tokens"), 0)
        record.rid = meta.get("id", record.rid)
        if seen == 0 and count is not None:
            return count, count
        if seen == 0:
            self.seen.pieces = []
        pieces = self.seen.pieces
        if pieces is None:  # a chunk without a count in a counted stream: one token
            return count, max(1, (count or 0) - seen)
        text = chunk.get("text") if isinstance(chunk.get("text"), str) else ""
        piece = text[len(self._text) :] if text.startswith(self._text) else text
        self._text = text
        if count is not None:
            self.seen.usage = count
        if not piece:
            return count, 0
        pieces.append(piece)
        self.text_kept += len(piece)
        return count, max(1, (count or 0) - seen)

    def _openai_event(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self.done = True
        if self.stopped or self.done:
            return
        record = self.record
        chunk = self._parse(payload)
        error = error_of(chunk)
        if error or not isinstance(chunk, dict):
            self._error(error or "not a JSON object")
            return
        usage = chunk.get("usage")
        timings = chunk.get("timings")  # llama.cpp's server, on its last chunk
        if isinstance(timings, dict) and isinstance(timings.get("draft_n_accepted"), int):
            self.draft_accepted = timings["draft_n_accepted"]
        count = None
        if isinstance(usage, dict):
            record.prompt_tokens = _count(usage.get("prompt_tokens"), 0)
            details = usage.get("prompt_tokens_details")
            details = details if isinstance(details, dict) else {}
            record.cached_tokens = _count(details.get("cached_tokens"), record.cached_tokens)
            count = _int(usage.get("completion_tokens"))
            self.seen.usage = count if count is not None else self.seen.usage
        self.finish = self.dialect.finish(chunk) or self.finish
        choices = chunk.get("choices")
        c = choices[0] if isinstance(choices, list) and choices else {}
        c = c if isinstance(c, dict) else {}
        delta = c.get("delta")
        piece = (
            c.get("text")
            if "text" in c
            else delta.get("content")
            if isinstance(delta, dict)
            else None
        )
        counts = self.seen.counts
        if not piece and not (c and count and counts and counts[-1] is not None
                              and count > counts[-1]):  # fmt: skip
            # the role chunk, the finish, or the final usage-only chunk; a chunk whose running
            # count grew without text (special tokens after an ignored EOS) carried tokens
            if count is not None:
                self.seen_tokens = record.completion_tokens = max(self.seen_tokens, count)
            return
        total = max(count or 0, self.seen_tokens + 1)
        if total > self.most or self.text_kept > bounded.ANSWER_TEXT:
            self._over(total)
            return
        if record.chunks == 0:
            record.ttft = now - self.start
        self.seen.arrivals.append(now)
        self.seen.counts.append(count)
        if self.seen.pieces is not None:
            self.seen.pieces.append(str(piece or ""))
            self.text_kept += len(str(piece or ""))
        # counted as they arrive: the live progress counts tokens of requests in flight
        self.seen_tokens = record.completion_tokens = max(count or 0, self.seen_tokens + 1)
        record.chunks += 1
        self.last = now

    def _over(self, total: int) -> None:
        text = bounded.mib(bounded.ANSWER_TEXT)
        self._error(f"the answer went past {self.most} tokens (the server counted {total}) "
                    f"or {text} of text: the rest was ignored")  # fmt: skip

    def _error(self, message: str) -> None:
        """An error event or object: the server's message; the rest of the stream is ignored."""
        self.record.error = message
        self.stopped = True

    def conclude(self, max_tokens: int, tokenizer: str | None, body: str = "") -> None:
        """The request's outcome once its stream ended: failed where no chunk carried a
        token (a usage alone, however large, is no answer: its TTFT was never measured, and
        it read ok with TTFT 0), or where its ending failed it; else its count."""
        record = self.record
        if not self.seen.arrivals:
            counted = f" (the server counted {self.seen_tokens})" if self.seen_tokens else ""
            record.error = "no tokens received" + counted + (f": {body}" if body else "")
            return
        record.error = self.ending()
        if record.error:
            return
        self.count(max_tokens, tokenizer)
        record.spec_verify_ct = self.spec_verify_ct(record.completion_tokens)
        record.ok = True

    def count(self, max_tokens: int, tokenizer: str | None) -> None:
        """The request's token count, its source and its inter-token gaps (tokencount.py)."""
        record = self.record
        counted = decide(self.seen, max_tokens, lambda: tokencount.tokenizer(tokenizer))
        record.completion_tokens = counted.tokens
        record.tokens_source = counted.source
        record.itl_per_chunk = counted.itl_per_chunk
        record.tokens_note = counted.note
        record.itl = tokencount.itl(self.seen.arrivals, counted.per_chunk)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(value: object, otherwise: int) -> int:
    """A count the server reported, where it is one (a whole number, not negative); else
    `otherwise`: a null, a string or a list from a hostile server is no crash in the read
    callback (that left the request waiting for its timeout)."""
    found = _int(value)
    return found if found is not None and found >= 0 else otherwise


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
    tracker = _StreamTracker(backend, record, start, prompt.output_len)
    try:
        response = await client.post_stream(path, body, tracker.on_event, timeout, tracker.on_typed)
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
