"""Issue 79, bullet 3: every way a stream can end is decided by the dialect adapter
(host/bench/dialects.py), and a census runs every registered dialect against every ending
(dialects.ENDINGS), each served for real by tests/habits_app.py under uvicorn.

Before: `event: error` then `[DONE]` was an ok request with 5 of 20 tokens; so was SGLang's
OpenAI error object (`{"object": "error", ...}`) and an abort finish reason; a data event
that is not JSON raised inside the read callback."""

from __future__ import annotations

import asyncio
import itertools

import pytest

import habits_app
from gpufleet.host.bench import dialects
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_level
from gpufleet.sim.sshd import free_port

CASES = list(itertools.product(dialects.NAMES, dialects.ENDINGS))
REQUESTS, TOKENS = 2, 20


def test_the_fake_server_ends_a_stream_every_way_the_dialects_know():
    """A new ending in dialects.ENDINGS without a way to serve it fails here."""
    assert set(habits_app.ENDINGS) == set(dialects.ENDINGS)
    assert set(habits_app.OK_ENDINGS) == {e for e, v in dialects.ENDINGS.items() if v == "ok"}


@pytest.fixture(scope="module")
def ended():
    port = free_port()
    server = habits_app.start(port)
    url = f"http://127.0.0.1:{port}"

    async def one(backend, ending):
        prompts = [Prompt(f"{backend} {ending} {i}", output_len=TOKENS) for i in range(REQUESTS)]
        spec = LevelSpec(backend=backend, warmup=0, request_timeout=20)
        return await run_level(f"{url}/e/{ending}", prompts, REQUESTS, spec)

    async def every():
        return await asyncio.gather(*(one(*case) for case in CASES))

    try:
        runs = asyncio.run(every())
    finally:
        server.terminate()
        server.wait(10)
    return dict(zip(CASES, runs, strict=True))


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_every_dialect_decides_every_ending(ended, case):
    backend, ending = case
    records = ended[case].records
    if dialects.ENDINGS[ending] == "ok":
        assert [(r.ok, r.error, r.completion_tokens) for r in records] == [
            (True, None, TOKENS)
        ] * REQUESTS
        return
    for r in records:
        assert not r.ok and r.error, (ending, r)
        if ending == "cut":
            assert r.error == "stream ended early after 5 tokens"
        elif ending == "abort":  # OpenAI's finish reason is one word; SGLang's has a message
            assert r.error.startswith("the server ended the request (abort)")
            assert (habits_app.ERROR in r.error) == (backend == "sglang")
        else:  # the server's own words, bounded
            assert habits_app.ERROR in r.error and len(r.error) <= 400, r.error


def test_an_error_event_stays_typed_however_its_lines_are_framed():
    """The fast path reads an HTTP chunk that is one `data:` event without the parser: an
    `event: error` line that came in the chunk before must still type that event."""
    from gpufleet.host.bench import httpparse
    from helpers import NoTransport

    body = b'data: {"a": 1}\n\nevent: error\ndata: {"message": "boom"}\n\ndata: [DONE]\n\n'

    async def read(cuts: tuple[int, int]) -> tuple[list[bytes], list[tuple[bytes, bytes]]]:
        proto = httpparse.StreamProtocol()
        proto.connection_made(NoTransport())  # type: ignore[arg-type]
        data, typed = [], []
        done = proto.send(b"", lambda p, _: data.append(p), lambda k, p, _: typed.append((k, p)))
        proto.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   b"transfer-encoding: chunked\r\n\r\n", 0.0)  # fmt: skip
        a, b = cuts
        for part in (body[:a], body[a:b], body[b:]):  # HTTP chunks, each read on its own
            if part:
                proto.feed(b"%x\r\n%s\r\n" % (len(part), part), 0.0)
        proto.feed(b"0\r\n\r\n", 0.0)
        await asyncio.wait_for(done, 1)
        return data, typed

    for cuts in itertools.combinations(range(1, len(body)), 2):
        data, typed = asyncio.run(read(cuts))
        assert data == [b'{"a": 1}', b"[DONE]"], cuts
        assert typed == [(b"error", b'{"message": "boom"}')], cuts
