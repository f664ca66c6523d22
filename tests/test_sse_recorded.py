"""Streams as real engines wrote them (issue 52, bullet 5): each recording in
tests/fixtures/streams/ (scripts/record_stream.py: the body byte for byte, and the server's
own /metrics token count) is read by the parser the same way at any split of its bytes,
and served over a real socket to gpufleet's bench client, which must count exactly the
tokens the server counted; and the same stream rewritten in the other forms the standard
allows (CRLF or CR line ends, `data:` without its space, `event:`/`id:` lines first) gives
the same record."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.bench.httpstream import StreamClient
from gpufleet.host.bench.level import Prompt, RequestRecord
from gpufleet.host.bench.sender import Sending, one_request
from test_sse import events_of

pytestmark = pytest.mark.unit

STREAMS = Path(__file__).parent / "fixtures" / "streams"
RECORDINGS = sorted(STREAMS.glob("*.sse"))
NAMES = [p.stem for p in RECORDINGS]


def _meta(path: Path) -> dict:
    return json.loads(path.with_suffix(".json").read_text())


def test_every_engine_the_adapters_can_serve_here_has_a_recording():
    """llama.cpp's server (built and run on the lent machine) and the rehearsal engine,
    which streams as SGLang does (REFERENCE.md); SGLang and vLLM cannot serve on these
    machines (fixtures/streams/README.md)."""
    engines = {_meta(p)["engine"] for p in RECORDINGS}
    assert {"llamacpp", "sim"} <= engines
    backends = {(_meta(p)["engine"], _meta(p)["backend"]) for p in RECORDINGS}
    assert ("sim", "sglang") in backends and ("llamacpp", "openai-chat") in backends


@pytest.mark.parametrize("path", RECORDINGS, ids=NAMES)
def test_a_recording_is_one_event_per_blank_line_ending_in_done(path):
    body = path.read_bytes()
    events = events_of(body)
    assert len(events) == body.count(b"\n\n") and events[-1] == b"[DONE]"
    assert all(json.loads(e) for e in events[:-1])


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_any_split_of_a_recorded_stream_yields_itsevents_of(data):
    path = data.draw(st.sampled_from(RECORDINGS))
    body = path.read_bytes()
    cuts = data.draw(st.lists(st.integers(1, len(body) - 1), max_size=40))
    bounds = [0, *sorted(set(cuts)), len(body)]
    assert events_of(*(body[a:b] for a, b in itertools.pairwise(bounds))) == events_of(body)


def _rewritten(body: bytes, form: str) -> bytes:
    """The same events in another form the standard allows."""
    if form == "crlf":
        return body.replace(b"\n", b"\r\n")
    if form == "cr":
        return body.replace(b"\n", b"\r")
    if form == "no-space":
        return re.sub(rb"^data: ", b"data:", body, flags=re.M)
    if form == "fields-first":
        return re.sub(rb"^data: ", b": comment\nevent: message\nid: 7\ndata: ", body, flags=re.M)
    return body


async def _serve_and_request(body: bytes, meta: dict, piece: int) -> RequestRecord:
    """Serve `body` (in chunks of `piece` bytes) over a real socket; one bench request."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        for at in range(0, len(body), piece):
            chunk = body[at : at + piece]
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = StreamClient(f"http://127.0.0.1:{port}")
    record = RequestRecord(index=0)
    prompt = Prompt(text=meta["request"].get("prompt") or "x", output_len=24)
    async with server:
        sending = Sending(meta["backend"], "default", True, 10)
        await one_request(client, sending, prompt, record, t0=0.0)
    return record


@pytest.mark.parametrize("path", RECORDINGS, ids=NAMES)
@pytest.mark.parametrize("form", ["as-recorded", "crlf", "cr", "no-space", "fields-first"])
def test_the_bench_client_counts_the_tokens_the_server_counted(path, form):
    meta = _meta(path)
    body = _rewritten(path.read_bytes(), form)
    records = [asyncio.run(_serve_and_request(body, meta, piece)) for piece in (7, 4096)]
    for record in records:
        assert record.ok and record.error is None, record.error
        assert record.completion_tokens == meta["server_tokens"], (path.name, form)
    assert records[0].completion_tokens == records[1].completion_tokens
    assert records[0].chunks == records[1].chunks
    last = json.loads(events_of(path.read_bytes())[-2])
    if isinstance(last.get("timings"), dict) and "draft_n_accepted" in last["timings"]:
        accepted = last["timings"]["draft_n_accepted"]
        assert records[0].spec_verify_ct == meta["server_tokens"] - accepted
    verify = (last.get("meta_info") or {}).get("spec_verify_ct")  # SGLang's own count
    if verify is not None:
        assert records[0].spec_verify_ct == verify


@pytest.mark.parametrize("path", RECORDINGS, ids=NAMES)
def test_a_stream_cut_short_before_its_end_is_a_failed_request(path):
    """Issue 67: a stream that ended cleanly after 7 of 20 tokens, with no `[DONE]` and no
    finish reason, was recorded as ok. Each real recording, cut after its 7th event, is
    a failed request saying so; without only its `[DONE]`, its finish reason still ends it
    the way the protocol says (ok)."""
    meta = _meta(path)
    events = events_of(path.read_bytes())
    cut = b"".join(b"data: " + e + b"\n\n" for e in events[:7])
    record = asyncio.run(_serve_and_request(cut, meta, 4096))
    assert not record.ok
    assert record.error == f"stream ended early after {record.completion_tokens} tokens"
    assert 0 < record.completion_tokens < meta["server_tokens"]
    no_done = b"".join(b"data: " + e + b"\n\n" for e in events[:-1])
    whole = asyncio.run(_serve_and_request(no_done, meta, 4096))
    assert whole.ok and whole.completion_tokens == meta["server_tokens"], whole.error
