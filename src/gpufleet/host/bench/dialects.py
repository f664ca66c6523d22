"""The HTTP dialects the load generator speaks, one registry (as vLLM's
`ASYNC_REQUEST_FUNCS`): each entry is its whole request function: its route, its request
body, the reader of its stream (streamread.py) and which backend SGLang's own
bench_serving calls it. A new OpenAI-compatible engine is an adapter whose default dialect
is one of these; an engine with its own stream format is one entry (`register`) whose
reader is a StreamReader subclass: the sender asks the entry, never its name
(tests/test_dialect_added.py adds one at run time).

How a stream ends is decided alike for every dialect (streamend.py, ENDINGS: every way;
tests/test_stream_endings.py runs each registered dialect against each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.host.bench.httpstream import RequestBody
from gpufleet.host.bench.level import Prompt
from gpufleet.host.bench.streamend import ENDINGS as ENDINGS  # every way a stream ends
from gpufleet.host.bench.streamread import OpenAIStream, SglangStream, StreamReader

Messages = list[dict[str, str]]  # an OpenAI chat conversation (a multi-turn session's)


@dataclass(frozen=True)
class Dialect:
    name: str  # what --backend says
    route: str
    body: Callable[[Prompt, str, bool, Messages | None], RequestBody]  # prompt, model, ...
    reader: type[StreamReader]  # reads its stream into the request's record
    bench_serving: str = ""  # SGLang bench_serving's --backend for the same requests


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
        Dialect("sglang", "/generate", _sglang, SglangStream, "sglang"),
        Dialect("openai", "/v1/completions", _openai, OpenAIStream, "sglang-oai"),
        Dialect("openai-chat", "/v1/chat/completions", _openai_chat, OpenAIStream,
                "sglang-oai-chat"),
    )
}  # fmt: skip
NAMES = tuple(DIALECTS)  # --backend's choices as the control machine builds them


def register(dialect: Dialect) -> None:
    """One more dialect, for the load generator in this process (its --backend choices
    are NAMES, fixed when the tasks are built)."""
    DIALECTS[dialect.name] = dialect
