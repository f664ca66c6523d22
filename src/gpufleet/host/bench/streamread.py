"""How one request's stream is read, one reader per stream format: a dialect's entry
(dialects.py) names its reader, so an engine with its own stream format is a reader class
and its entry, nothing in the sender. Each reader turns the stream's events into the
request's record at the time each arrived: what each chunk carried is kept (`seen`), the
count and the gaps decided at the end (tokencount.py), and how the stream ended by the
rules every dialect shares (streamend.py).

A reader's `on_event` runs once per streamed chunk inside the protocol's read callback, so
SGLang's reader is kept lean: after the first chunk, only `completion_tokens` is read.
"""

from __future__ import annotations

import json
import re

from gpufleet.host.agent import bounded
from gpufleet.host.bench import tokencount
from gpufleet.host.bench.level import RequestRecord
from gpufleet.host.bench.streamend import (
    Finish,
    error_of,
    event_error,
    openai_finish,
    outcome,
    sglang_finish,
)
from gpufleet.host.bench.tokencount import Seen, decide

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


class StreamReader:
    """What every reader shares: the record, the bounds on what an answer may count and
    keep (host/agent/bounded.py), the finish reason and how the stream ended, and the count
    decided at the end. A subclass reads its format's data events (`on_event`), says the
    whole answer (`final_text`) and reads a chunk's finish reason (`finish`)."""

    pieces: bool = True  # the answer's text comes in pieces (SGLang's: cumulative text)

    def __init__(self, record: RequestRecord, start: float, asked: int = 1 << 20) -> None:
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
        self.finish_seen: Finish | None = None  # the finish reason, as `finish` reads it
        self.seen = Seen(pieces=[] if self.pieces else None, text=self.final_text)

    @staticmethod
    def finish(chunk: object) -> Finish | None:
        """A chunk's finish reason (the server's JSON); None where it has none."""
        return None

    def on_event(self, payload: bytes, now: float) -> None:
        """One `data:` event, as it arrived."""
        raise NotImplementedError

    def read(self, payload: bytes, now: float) -> None:
        """`on_event`, with a chunk it could not read (a hostile server's shapes the parsers
        did not foresee) failing the request, said, instead of raising in the read callback,
        where it left the request waiting for its timeout."""
        try:
            self.on_event(payload, now)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError) as e:
            self._error(f"a chunk gpufleet could not read ({type(e).__name__}): "
                        f"{payload[:120].decode(errors='replace')}")  # fmt: skip

    def final_text(self) -> str:
        """The whole answer."""
        return "".join(self.seen.pieces or [])

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
        """Why the stream failed the request by how it ended (streamend.outcome), else None.
        SGLang's finish reason is in its last chunk's meta_info, read once here."""
        if self.last_payload and self.finish_seen is None:
            chunk = self._parse(self.last_payload)
            self.finish_seen = self.finish(chunk) if isinstance(chunk, dict) else None
        return outcome(self.done, self.finish_seen, self.seen_tokens)

    def on_typed(self, kind: bytes, payload: bytes, now: float) -> None:
        """An event of its own type: `event: error` fails the request; others are data."""
        if kind == b"error":
            self._error(event_error(payload))
        else:
            self.read(payload, now)

    def _parse(self, payload: bytes) -> object:
        try:
            return json.loads(payload)
        except ValueError:
            return payload.decode(errors="replace")

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


class SglangStream(StreamReader):
    """SGLang's /generate: `meta_info` carries the running count on every chunk and the
    text is cumulative; a stream whose first chunk has no count is read from its text."""

    pieces = False

    def __init__(self, record: RequestRecord, start: float, asked: int = 1 << 20) -> None:
        super().__init__(record, start, asked)
        self._text = ""  # the cumulative text so far, where its chunks have no count

    finish = staticmethod(sglang_finish)

    def final_text(self) -> str:
        """The whole answer: the last chunk's cumulative text, or the pieces read."""
        if self.seen.pieces is not None:
            return "".join(self.seen.pieces)
        chunk = self._parse(self.last_payload) if self.last_payload else None
        return str(chunk.get("text", "")) if isinstance(chunk, dict) else ""

    def on_event(self, payload: bytes, now: float) -> None:
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


class OpenAIStream(StreamReader):
    """OpenAI's completions and chat: `choices` carry each piece, `usage` the count where
    the server sends it (every chunk with `continuous_usage_stats`, else the last)."""

    finish = staticmethod(openai_finish)

    def on_event(self, payload: bytes, now: float) -> None:
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
        self.finish_seen = self.finish(chunk) or self.finish_seen
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
