"""The JSON the rehearsal's HTTP API (sim/api.py) answers with, declared: SGLang's
`meta_info` on /generate, OpenAI's envelopes, choices and usage as SGLang 0.5.x sends them
(docs/FACTS.md, "SGLang's HTTP server"), and the server-side trace /sim/trace gives."""

from __future__ import annotations

from typing import NotRequired, TypedDict


class Trace(TypedDict):
    """One finished request as /sim/trace gives it: the server's own clock."""

    rid: str
    arrived: float
    emit_times: list[float]
    sent_times: list[float]
    prompt_tokens: int
    completion_tokens: int


class MetaInfo(TypedDict):
    """SGLang's `meta_info` on /generate (its keys, the ones the rehearsal fills)."""

    id: str
    finish_reason: dict[str, str | int] | None  # {"type": "length", "length": N}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: NotRequired[float]
    spec_verify_ct: NotRequired[int]


class Usage(TypedDict):
    """OpenAI's `usage`; the details only with SGLang's --enable-cache-report."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: NotRequired[dict[str, int]]


class Choice(TypedDict):
    """One OpenAI choice: `text` (completions), `delta` (chat chunk) or `message`."""

    index: int
    finish_reason: str | None
    logprobs: None
    text: NotRequired[str]
    delta: NotRequired[dict[str, str]]
    message: NotRequired[dict[str, str]]


class Envelope(TypedDict):
    """An OpenAI answer or chunk around its choices."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: NotRequired[Usage]
