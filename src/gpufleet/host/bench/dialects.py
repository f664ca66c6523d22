"""The HTTP dialects the load generator speaks, one registry (as vLLM's
`ASYNC_REQUEST_FUNCS`): each names its route, builds its request body, says how its
stream's events are read, and which backend SGLang's own bench_serving calls it. A new
OpenAI-compatible engine is an adapter whose default dialect is one of these; a new
dialect is one entry here (kinds of stream events: sender._StreamTracker).

How a stream ends is decided here too, for every dialect alike (ENDINGS lists every way;
tests/test_stream_endings.py runs each dialect against each): an error event or object
fails the request whatever follows it, a finish reason that says the server aborted
fails it, `[DONE]` or a finish reason ends it, and a stream that stops with neither was
cut short.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.host.bench.httpstream import RequestBody
from gpufleet.host.bench.level import Prompt

Messages = list[dict[str, str]]  # an OpenAI chat conversation (a multi-turn session's)


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


def _finish(reason: object) -> Finish | None:
    if isinstance(reason, dict):  # SGLang: {"type": "length", ...} or {"type": "abort", ...}
        word = reason.get("type")
        return Finish(_text(word), _text(reason.get("message") or "")) if word else None
    return Finish(_text(reason)) if reason else None


def _sglang_finish(chunk: object) -> Finish | None:
    meta = chunk.get("meta_info") if isinstance(chunk, dict) else None
    return _finish(meta.get("finish_reason")) if isinstance(meta, dict) else None


def _openai_finish(chunk: object) -> Finish | None:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return _finish(first.get("finish_reason")) if isinstance(first, dict) else None


def outcome(done: bool, finish: Finish | None, tokens: int) -> str | None:
    """How a stream that sent no error ended the request: None (ok), else why it failed."""
    if finish is not None and finish.aborted:
        said = f": {finish.message}" if finish.message else ""
        return f"the server ended the request ({finish.reason}){said}"
    if done or finish is not None:
        return None
    return f"stream ended early after {tokens} tokens"


@dataclass(frozen=True)
class Dialect:
    name: str  # what --backend says
    route: str
    body: Callable[[Prompt, str, bool, Messages | None], RequestBody]  # prompt, model, ...
    events: str  # how its stream reads: "sglang" (meta_info) or "openai" (choices, usage)
    bench_serving: str  # SGLang bench_serving's --backend for the same requests
    finish: Callable[[object], Finish | None]  # a chunk's finish reason (the server's JSON)


def _sglang(prompt: Prompt, model: str, ignore_eos: bool, messages: Messages | None) -> RequestBody:
    source = {"input_ids": prompt.input_ids} if prompt.input_ids else {"text": prompt.text}
    return {
        **source,
        "sampling_params": {
            "max_new_tokens": prompt.output_len,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
        },
        "stream": True,
    }


def _openai_common(prompt: Prompt, model: str, ignore_eos: bool) -> RequestBody:
    return {
        "model": model,
        "max_tokens": prompt.output_len,
        "temperature": 0.0,
        "stream": True,
        # usage in every chunk: how many tokens each chunk carried, for per-token ITL
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": ignore_eos,
    }


def _openai(prompt: Prompt, model: str, ignore_eos: bool, messages: Messages | None) -> RequestBody:
    return {**_openai_common(prompt, model, ignore_eos), "prompt": prompt.input_ids or prompt.text}


def _openai_chat(
    prompt: Prompt, model: str, ignore_eos: bool, messages: Messages | None
) -> RequestBody:
    """`messages` (a multi-turn conversation) when given; else the prompt as one turn."""
    return {
        **_openai_common(prompt, model, ignore_eos),
        "messages": messages or [{"role": "user", "content": prompt.text}],
    }


DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        Dialect("sglang", "/generate", _sglang, "sglang", "sglang", _sglang_finish),
        Dialect("openai", "/v1/completions", _openai, "openai", "sglang-oai", _openai_finish),
        Dialect(
            "openai-chat",
            "/v1/chat/completions",
            _openai_chat,
            "openai",
            "sglang-oai-chat",
            _openai_finish,
        ),
    )
}
NAMES = tuple(DIALECTS)
