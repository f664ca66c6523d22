"""How a stream ends, decided alike for every dialect (ENDINGS lists every way;
tests/test_stream_endings.py runs each registered dialect against each): an error event or
object fails the request whatever follows it, a finish reason that says the server aborted
fails it, `[DONE]` or a finish reason ends it, and a stream that stops with neither was
cut short. The stream readers (streamread.py) ask these; a dialect's own finish reader is
its reader's `finish`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_MESSAGE = 300  # characters of a server's error message kept (it is untrusted)

# Every way a stream can end, and what the request becomes.
ENDINGS: dict[str, str] = {
    "done": "ok",  # the tokens, then `data: [DONE]`
    "finish_reason": "ok",  # a finish reason (length, stop), then the response ends
    "error_event": "failed",  # `event: error`, its data the message, even if [DONE] follows
    "error_object": "failed",  # data {"error": ...} (SGLang's /generate, vLLM), then [DONE]
    "error_response": "failed",  # data {"object": "error", "message": ...} (SGLang's OpenAI)
    "abort": "failed",  # a finish reason that says the server ended it (SGLang's abort)
    "cut": "failed",  # neither [DONE] nor a finish reason: the stream was cut short
    "not_json": "failed",  # a data event that is not JSON
}
ABORTED = frozenset({"abort", "error", "cancelled"})


@dataclass(frozen=True)
class Finish:
    """A finish reason as a stream gave it: its word and, for an abort, the server's message."""

    reason: str
    message: str = ""

    @property
    def aborted(self) -> bool:
        return self.reason.lower() in ABORTED


def _text(value: object) -> str:
    return str(value)[:MAX_MESSAGE]


def error_of(chunk: object) -> str | None:
    """The server's message when a data event is an error (any dialect); else None."""
    if not isinstance(chunk, dict):
        return f"a data event that is not a JSON object: {_text(chunk)}"
    if "error" in chunk:
        error = chunk["error"]
        return _text(error.get("message", error) if isinstance(error, dict) else error)
    if chunk.get("object") == "error":
        return _text(chunk.get("message") or chunk)
    return None


def event_error(data: bytes) -> str:
    """The message of an `event: error` event: its JSON's, else its text."""
    try:
        parsed: Any = json.loads(data)
    except ValueError:
        return _text(data.decode(errors="replace")) or "an error event"
    if isinstance(parsed, dict) and "error" not in parsed and parsed.get("message"):
        return _text(parsed["message"])
    return error_of(parsed) or _text(parsed)


def finish_of(reason: object) -> Finish | None:
    if isinstance(reason, dict):  # SGLang: {"type": "length", ...} or {"type": "abort", ...}
        word = reason.get("type")
        return Finish(_text(word), _text(reason.get("message") or "")) if word else None
    return Finish(_text(reason)) if reason else None


def sglang_finish(chunk: object) -> Finish | None:
    meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
    return finish_of(meta.get("finish_reason")) if isinstance(meta, dict) else None


def openai_finish(chunk: object) -> Finish | None:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return finish_of(first.get("finish_reason")) if isinstance(first, dict) else None


def outcome(done: bool, finish: Finish | None, tokens: int) -> str | None:
    """How a stream that sent no error ended the request: None (ok), else why it failed."""
    if finish is not None and finish.aborted:
        said = f": {finish.message}" if finish.message else ""
        return f"the server ended the request ({finish.reason}){said}"
    if done or finish is not None:
        return None
    return f"stream ended early after {tokens} tokens"
