"""Server-sent events to the standard (issue 52): `data:` with or without its space,
`event`/`id`/`retry` fields and comments, multi-line data, CR, LF and CRLF line ends, any
split of the bytes into reads; and a stream that is not server-sent events is an error on
the request, not tokens dropped without a word (only `data: ` at an event's start was read
before: `data:{...}`, an `event:` line first, or CR line ends lost every token)."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.bench import httpparse
from gpufleet.host.bench.sse import EventStream
from helpers import NoTransport


def events_of(*reads: bytes) -> list[bytes]:
    got: list[bytes] = []
    stream = EventStream(lambda data, _: got.append(data))
    for data in reads:
        stream.feed(data, 0.0)
    stream.close(0.0)
    return got


def test_every_form_the_standard_allows():
    assert events_of(b"data: a\n\n", b"data:b\n\n") == [b"a", b"b"]  # one space dropped
    assert events_of(b"data:  two spaces\n\n") == [b" two spaces"]  # only one
    assert events_of(b"event: delta\nid: 7\ndata: x\n\n") == [b"x"]
    assert events_of(b": keep-alive\n\ndata: x\n\n") == [b"x"]  # a comment is not an event
    assert events_of(b"data: line 1\ndata: line 2\n\n") == [b"line 1\nline 2"]
    assert events_of(b"data: cr\r\rdata: crlf\r\n\r\ndata: lf\n\n") == [b"cr", b"crlf", b"lf"]
    assert events_of(b"retry: 3000\nid: 1\n\n") == []  # no data: nothing dispatched
    assert events_of(b"data\n\n") == [b""]  # a field without a colon has an empty value
    assert events_of(b"data: last, unterminated") == [b"last, unterminated"]


def test_the_fields_besides_data_are_kept():
    stream = EventStream(None)
    stream.feed(b"retry: 2500\nid: 41\nevent: ping\ndata: x\n\nid: bad\0id\n\n", 0.0)
    assert (stream.retry_ms, stream.last_id, stream.events) == (2500, b"41", 1)


STREAM = (b": hello\r\nevent: message\r\ndata: {\"a\": 1}\r\n\r\n"
          b"data:{\"b\": 2}\n\ndata: multi\rdata: line\r\rid: 3\ndata: [DONE]\n\n")  # fmt: skip
WANT = [b'{"a": 1}', b'{"b": 2}', b"multi\nline", b"[DONE]"]


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=20))
def test_any_split_of_the_same_bytes_yields_the_same_events(cuts):
    """A CR that ends one read and the LF that starts the next are one line end."""
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    reads = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert events_of(*reads) == WANT


def _response(body: bytes) -> tuple[list[bytes], BaseException | None]:
    """The events gpufleet's HTTP client reads from one chunked event-stream response."""

    async def scenario() -> tuple[list[bytes], BaseException | None]:
        proto = httpparse.StreamProtocol()
        proto.connection_made(NoTransport())  # type: ignore[arg-type]
        got: list[bytes] = []
        done = proto.send(b"", lambda payload, _: got.append(payload))
        proto.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   b"transfer-encoding: chunked\r\n\r\n", 0.0)  # fmt: skip
        proto.feed(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body), 0.0)
        try:
            await asyncio.wait_for(done, 1)
        except httpparse.HTTPStreamError as exc:
            return got, exc
        return got, None

    return asyncio.run(scenario())


def test_the_client_reads_events_without_the_space_and_with_fields_first():
    sglang = b'data:{"text":"a","meta_info":{"completion_tokens":1}}\n\ndata:[DONE]\n\n'
    assert _response(sglang) == ([b'{"text":"a","meta_info":{"completion_tokens":1}}',
                                  b"[DONE]"], None)  # fmt: skip
    named = b'event: message\nid: 1\ndata: {"choices":[]}\n\ndata: [DONE]\n\n'
    assert _response(named) == ([b'{"choices":[]}', b"[DONE]"], None)


def test_a_stream_that_is_not_server_sent_events_is_an_error():
    got, error = _response(b'{"text": "a"}\n{"text": "a b"}\n')  # JSON lines, not events
    assert got == [] and error is not None
    assert "held no data events" in str(error)
