"""Issue 79, adversarial pass: a hostile server's chunk shapes. Every field the adapters
read (usage and its counts, SGLang's meta_info, choices, delta, text, finish reasons) given
any JSON value: the request ends as ok with a count or as a said error, never an exception
in the read callback. Before: `"prompt_tokens": null` in a usage raised TypeError inside the
protocol's callback, and the request waited for its timeout (a level of them, the run)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.bench.dialects import DIALECTS
from gpufleet.host.bench.level import RequestRecord

ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6,
)  # fmt: skip
COUNT = st.integers(0, 40) | ANY


@st.composite
def openai_chunk(draw, chat: bool):
    choice = {"index": 0, "finish_reason": draw(st.none() | st.sampled_from(["stop", "length"])
                                                | ANY)}  # fmt: skip
    text = draw(st.text(min_size=1, max_size=4) | ANY)
    if chat:
        choice["delta"] = draw(st.just({"content": text}) | ANY)
    else:
        choice["text"] = text
    chunk = {"object": "chunk", "choices": draw(st.just([choice]) | ANY)}
    if draw(st.booleans()):
        details = draw(st.just({"cached_tokens": draw(COUNT)}) | ANY)
        chunk["usage"] = draw(st.just({"prompt_tokens": draw(COUNT), "completion_tokens":
                                       draw(COUNT), "prompt_tokens_details": details}) | ANY)  # fmt: skip
    return chunk


@st.composite
def sglang_chunk(draw):
    meta = {k: draw(COUNT) for k in ("completion_tokens", "prompt_tokens", "cached_tokens")
            if draw(st.booleans())}  # fmt: skip
    meta["id"] = draw(st.text(max_size=4) | ANY)
    meta["finish_reason"] = draw(st.none() | st.just({"type": "length"}) | ANY)
    return {"text": draw(st.text(max_size=12) | ANY), "meta_info": draw(st.just(meta) | ANY)}


def _feed(backend: str, chunks: list[object]) -> RequestRecord:
    record = RequestRecord(0)
    tracker = DIALECTS[backend].reader(record, 0.0, 16)
    for i, chunk in enumerate(chunks):
        tracker.read(json.dumps(chunk).encode(), 0.01 * (i + 1))
    tracker.read(b"[DONE]", 1.0)
    if not record.error:
        tracker.conclude(16, None)
    if record.ok:  # measured: from a chunk that carried tokens, with a count and a TTFT
        assert record.completion_tokens >= 1 and record.tokens_source and record.ttft > 0
        assert len(record.itl) <= record.completion_tokens
    return record


@settings(max_examples=150, deadline=None)
@given(st.lists(openai_chunk(chat=False), min_size=1, max_size=6))
def test_any_value_in_an_openai_chunk_ends_the_request_not_the_callback(chunks):
    _feed("openai", chunks)


@settings(max_examples=150, deadline=None)
@given(st.lists(openai_chunk(chat=True), min_size=1, max_size=6))
def test_any_value_in_a_chat_chunk_ends_the_request_not_the_callback(chunks):
    _feed("openai-chat", chunks)


@settings(max_examples=150, deadline=None)
@given(st.lists(sglang_chunk(), min_size=1, max_size=6))
def test_any_value_in_an_sglang_chunk_ends_the_request_not_the_callback(chunks):
    _feed("sglang", chunks)


def test_a_usage_without_a_chunk_of_text_is_no_answer():
    """A server that sends its count in the role chunk or a usage-only chunk and no text:
    it read ok with 8 (or, above max_tokens, 0) tokens and TTFT 0 ms."""
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 8}}  # fmt: skip
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    record = _feed("openai-chat", [role, finish])
    assert not record.ok and record.error == "no tokens received (the server counted 8)"


def test_a_null_prompt_count_is_no_count_and_the_request_is_measured():
    words = [{"choices": [{"index": 0, "text": f"w{i} "}]} for i in range(8)]
    usage = {"choices": [], "usage": {"prompt_tokens": None, "completion_tokens": 8,
                                      "prompt_tokens_details": [1]}}  # fmt: skip
    record = _feed("openai", [*words, usage])
    assert (record.error, record.completion_tokens, record.tokens_source) == (None, 8, "usage")
