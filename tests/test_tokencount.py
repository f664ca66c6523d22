"""Issue 79, bullets 1-2 at the unit level: the count order (host/bench/tokencount.py) over
every habit and chunking hypothesis can draw, the tokenizer loaded only where it can be,
and `event: error` handed to the dialect (host/bench/sse.py)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import habits_app
from gpufleet.host.bench import tokencount
from gpufleet.host.bench.sse import EventStream
from gpufleet.host.bench.tokencount import Seen, decide


def _words(texts: list[str]) -> list[int]:
    return [len(t.split()) for t in texts]


def _seen(ks: list[int], habit: str) -> Seen:
    """What a tracker sees of chunks carrying `ks` tokens, the server reporting as `habit`."""
    n, sent, counts, pieces = sum(ks), 0, [], []
    for k in ks:
        pieces.append("".join(f"w{sent + i} " for i in range(k)))
        sent += k
        counts.append(habits_app._usage(habit, sent, n, False))
    return Seen(
        arrivals=[0.08 * i for i in range(len(ks))],
        counts=counts,
        usage=habits_app._usage(habit, n, n, True),
        pieces=pieces,
    )


@settings(max_examples=300, deadline=None)
@given(
    ks=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    habit=st.sampled_from(habits_app.HABITS),
    with_tokenizer=st.booleans(),
)
def test_the_count_is_never_silently_above_the_truth(ks, habit, with_tokenizer):
    n, chunks = sum(ks), len(ks)
    seen = _seen(ks, habit)
    counted = decide(seen, n, lambda: _words if with_tokenizer else None)
    assert chunks <= counted.tokens <= n  # never above what was sent, never below the chunks
    knowable = habit == "perchunk" or with_tokenizer or (n == chunks and seen.usage == n)
    if knowable:
        assert counted.tokens == n and counted.per_chunk == ks and not counted.itl_per_chunk
    if seen.usage is not None and seen.usage != counted.tokens:
        assert counted.note and str(seen.usage) in counted.note  # both figures said
    if counted.source == "chunks":
        assert "approximation" in (counted.note or "")
    gaps = tokencount.itl(seen.arrivals, counted.per_chunk)
    assert len(gaps) == sum(counted.per_chunk[1:])
    assert sum(gaps) == pytest.approx(seen.arrivals[-1] - seen.arrivals[0])


def test_usage_below_the_chunks_is_not_believed():
    seen = Seen(arrivals=[0.0, 0.1, 0.2], counts=[None] * 3, usage=2, pieces=["a ", "b ", "c "])
    counted = decide(seen, 10, lambda: None)
    assert (counted.tokens, counted.source) == (3, "chunks")
    assert "server usage 2 below the 3 chunks" in (counted.note or "")


def test_a_usage_above_the_text_is_kept_and_said():
    """A token is at least a byte of text unless the server does not print it (a special
    token after an ignored EOS): the count stays, the note says so."""
    seen = Seen(arrivals=[0.0, 0.1], counts=[None, None], usage=9, pieces=["a", "b"])
    counted = decide(seen, 10, lambda: None)
    assert counted.tokens == 9 and "above what the 2 bytes streamed could hold" in counted.note


def test_the_tokenizer_is_loaded_only_where_it_can_be(tmp_path):
    assert tokencount.tokenizer(None) is None
    assert tokencount.tokenizer(str(tmp_path / "no-model")) is None  # nothing there: next source
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    assert tokencount.tokenizer(str(broken)) is None
    model = habits_app.word_tokenizer(tmp_path / "model")
    count = tokencount.tokenizer(str(model))
    assert count is not None and count(["w1 w2 w3 ", "w4"]) == [3, 1]


def test_an_event_of_its_own_type_goes_to_the_dialect():
    data, typed = [], []
    stream = EventStream(lambda d, t: data.append(d), lambda k, d, t: typed.append((k, d)))
    body = b'data: a\n\nevent: error\ndata: {"message": "x"}\n\nevent: message\ndata: b\n\n'
    for a, b in itertools.pairwise(range(0, len(body) + 7, 7)):
        stream.feed(body[a:b], 0.0)
    assert data == [b"a", b"b"] and typed == [(b"error", b'{"message": "x"}')]
    untyped = []
    plain = EventStream(lambda d, t: untyped.append(d))  # no handler: read as data, as before
    plain.feed(body, 0.0)
    assert untyped == [b"a", b'{"message": "x"}', b"b"]


def test_tokens_without_text_still_count_where_the_server_counts_every_chunk():
    """Special tokens after an ignored EOS print nothing: a chunk whose running count grew
    without text carried tokens (its gap is theirs); a finish or usage-only chunk did not."""
    import json

    from gpufleet.host.bench.dialects import DIALECTS
    from gpufleet.host.bench.level import RequestRecord

    record = RequestRecord(0)
    tracker = DIALECTS["openai-chat"].reader(record, 0.0)

    def chunk(content: str, count: int, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
        return json.dumps({"choices": [choice], "usage": {"completion_tokens": count}}).encode()

    for i, (text, count) in enumerate([("a ", 1), ("b ", 2), ("", 3), ("", 4), ("", 4)]):
        tracker.on_event(chunk(text, count, "length" if i == 4 else None), 0.1 * (i + 1))
    tracker.on_event(json.dumps({"choices": [], "usage": {"completion_tokens": 4}}).encode(), 0.6)
    tracker.on_event(b"[DONE]", 0.6)
    assert tracker.ending() is None
    tracker.count(4, None)
    assert (record.completion_tokens, record.tokens_source, record.tokens_note) == (
        4,
        "usage",
        None,
    )
    assert record.itl == pytest.approx([0.1, 0.1, 0.1]) and record.chunks == 4


def test_a_tokenizer_count_is_held_to_max_tokens_and_the_chunks():
    """Text tokenized again can count a little more or less than was generated."""
    seen = Seen(arrivals=[0.0, 0.1], counts=[None, None], usage=None, pieces=["a b c ", "d e "])
    assert decide(seen, 4, lambda: _words).tokens == 4  # 5 words, max_tokens 4
    assert decide(seen, 0, lambda: _words).tokens == 5  # no bound asked
    glued = Seen(arrivals=[0.0, 0.1, 0.2], counts=[None] * 3, pieces=["ab", "c", "d"])
    assert decide(glued, 8, lambda: lambda texts: [1] * len(texts)).tokens == 3  # >= chunks
