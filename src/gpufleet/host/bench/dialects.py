"""The HTTP dialects the load generator speaks, one registry (as vLLM's
`ASYNC_REQUEST_FUNCS`): each names its route, builds its request body, says how its
stream's events are read, and which backend SGLang's own bench_serving calls it. A new
OpenAI-compatible engine is an adapter whose default dialect is one of these; a new
dialect is one entry here (kinds of stream events: sender._StreamTracker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.host.bench.httpstream import RequestBody
from gpufleet.host.bench.level import Prompt

Messages = list[dict[str, str]]  # an OpenAI chat conversation (a multi-turn session's)


@dataclass(frozen=True)
class Dialect:
    name: str  # what --backend says
    route: str
    body: Callable[[Prompt, str, bool, Messages | None], RequestBody]  # prompt, model, ...
    events: str  # how its stream reads: "sglang" (meta_info) or "openai" (choices, usage)
    bench_serving: str  # SGLang bench_serving's --backend for the same requests


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
        Dialect("sglang", "/generate", _sglang, "sglang", "sglang"),
        Dialect("openai", "/v1/completions", _openai, "openai", "sglang-oai"),
        Dialect("openai-chat", "/v1/chat/completions", _openai_chat, "openai", "sglang-oai-chat"),
    )
}
NAMES = tuple(DIALECTS)
