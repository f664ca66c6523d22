"""The load generator's HTTP client against SGLang's own HTTP stack (Starlette under uvicorn).

Real sockets throughout: uvicorn in a subprocess for the server cases, a socketpair for the
parser property (any segmentation of the bytes gives the same events).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.host.bench import httpparse, httpstream
from gpufleet.host.bench.loadgen import LevelSpec, Prompt, run_async, run_level
from gpufleet.host.server import probe as healthprobe
from gpufleet.sim.sshd import free_port
from helpers import REPO, NoTransport


@pytest.fixture(scope="module")
def uvicorn_url():
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "sse_app:app",
            "--app-dir",
            str(REPO / "tests"),
            "--port",
            str(port),
            "--timeout-keep-alive",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not healthprobe.is_ready(url + "/health"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(10)


def level(
    url: str,
    n: int = 16,
    c: int = 4,
    out: int = 20,
    backend: str = "sglang",
    prompts_text: str = "prompt",
    **kw,
):
    prompts = [Prompt(f"{prompts_text} {i}", output_len=out) for i in range(n)]
    return run_async(run_level(url, prompts, c, LevelSpec(backend=backend, warmup=0, **kw)))


def test_sglang_stream_from_uvicorn_counts_every_token(uvicorn_url):
    run = level(uvicorn_url)
    assert [r.error for r in run.records] == [None] * 16
    for r in run.records:
        assert (r.completion_tokens, r.prompt_tokens, r.chunks, len(r.itl)) == (20, 7, 20, 19)
        assert 0 < r.ttft < r.e2e


def test_speculative_chunks_carry_several_tokens(uvicorn_url):
    run = level(uvicorn_url + "/spec3")
    for r in run.records:
        # 20 tokens in chunks of 3: 7 chunks. The first chunk's 3 tokens are the TTFT; after
        # it a k-token chunk counts as k gaps of 1/k (bench_serving's rule): 17 ITL values
        assert (r.ok, r.completion_tokens, r.chunks, len(r.itl)) == (True, 20, 7, 17)


@pytest.mark.parametrize("mode", ["", "/crlf"])
def test_openai_stream_takes_tokens_from_usage(uvicorn_url, mode):
    run = level(uvicorn_url + mode, backend="openai")
    for r in run.records:
        assert (r.ok, r.completion_tokens, r.prompt_tokens, r.chunks) == (True, 20, 5, 20)


def test_http_error_and_error_event_are_kept(uvicorn_url):
    bad = level(uvicorn_url, n=2, out=-1)
    assert [r.error for r in bad.records] == [
        "HTTP 400: "
        + json.dumps({"error": {"message": "max_new_tokens must be >= 0"}}, separators=(",", ":"))
    ] * 2
    mid = level(uvicorn_url + "/err5", n=3)
    for r in mid.records:
        assert not r.ok and r.error == "CUDA error: an illegal memory access"


def test_stalled_stream_times_out_with_a_reason(uvicorn_url):
    t = time.monotonic()
    run = level(uvicorn_url + "/stall", n=2, c=2, request_timeout=1.0)
    assert time.monotonic() - t < 5
    assert [r.error for r in run.records] == ["timed out after 1s"] * 2


def test_keep_alive_reused_and_expired_connections_replaced(uvicorn_url):
    async def scenario() -> list[int]:
        client = httpstream.StreamClient(uvicorn_url)
        ports = []

        async def one() -> None:
            seen = []
            body = {"text": "x", "sampling_params": {"max_new_tokens": 2}, "stream": True}
            resp = await client.post_stream("/generate", body, lambda p, t: seen.append(p), 10)
            assert resp.status == 200
            ports.append(json.loads(seen[0])["meta_info"]["client_port"])

        await one()
        await one()  # back to back: the same keep-alive connection
        await asyncio.sleep(1.6)  # uvicorn --timeout-keep-alive 1 closes the idle one
        await one()
        client.close()
        return ports

    ports = run_async(scenario())
    assert ports[0] == ports[1] and ports[2] != ports[1]


def test_unreachable_server_is_one_error_per_request():
    run = level(f"http://127.0.0.1:{free_port()}", n=3, c=3)
    assert all(r.error and r.error.startswith("ConnectionRefusedError") for r in run.records)


RESPONSE_EVENTS = [
    b'{"text":"a","meta_info":{"completion_tokens":1}}',
    b'{"text":"a b","meta_info":{"completion_tokens":2}}',
    b"[DONE]",
]


def chunked_response(events: list[bytes], sep: bytes, chunk_size: int) -> bytes:
    body = b"".join(b"data: " + e + sep for e in events)
    chunks = [body[i : i + chunk_size] for i in range(0, len(body), chunk_size)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    return head + framed


@settings(max_examples=60, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=12),
    sep=st.sampled_from([b"\n\n", b"\r\n\r\n"]),
    chunk_size=st.integers(min_value=1, max_value=200),
)
def test_any_segmentation_yields_the_same_events(cuts, sep, chunk_size):
    raw = chunked_response(RESPONSE_EVENTS, sep, chunk_size)
    pieces, at = [], 0
    for cut in sorted(set(cuts)):
        if at < cut < len(raw):
            pieces.append(raw[at:cut])
            at = cut
    pieces.append(raw[at:])

    async def scenario() -> tuple[list[bytes], int, bool]:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(httpparse.StreamProtocol, sock=ours)
        events: list[bytes] = []
        done = proto.send(b"POST / HTTP/1.1\r\n\r\n", lambda p, t: events.append(p))
        for piece in pieces:
            await loop.sock_sendall(theirs, piece)
            await asyncio.sleep(0)
        response = await asyncio.wait_for(done, 5)
        keep = proto.keep_alive and not proto.closed
        proto.abort()
        theirs.close()
        return events, response.status, keep

    events, status, keep_alive = asyncio.run(scenario())
    assert (events, status, keep_alive) == (RESPONSE_EVENTS, 200, True)


@settings(max_examples=80, deadline=None)
@given(
    per_chunk=st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=8),
    per_read=st.lists(st.integers(min_value=1, max_value=4), max_size=8),
    sep=st.sampled_from([b"\n\n", b"\r\n\r\n", b"\r\n\n"]),
    extension=st.booleans(),
)
def test_reads_of_whole_chunks_yield_every_event_once(per_chunk, per_read, sep, extension):
    """The read paths that skip the parser (one chunk of one event, whole chunks of one event
    each) must give what the parser gives: several events in a chunk, CRLF separators and
    chunk extensions go to the parser, nothing is lost or doubled."""
    events = [b'{"text":"%s","meta_info":{"completion_tokens":%d}}' % (b"ab" * i, i) for i in
              range(1, sum(per_chunk) + 1)] + [b"[DONE]"]  # fmt: skip
    chunks, at = [], 0
    for count in [*per_chunk, 1]:
        body = b"".join(b"data: " + e + sep for e in events[at : at + count])
        size = b"%x" % len(body) + (b";x=1" if extension else b"")
        chunks.append(size + b"\r\n" + body + b"\r\n")
        at += count
    chunks.append(b"0\r\n\r\n")
    reads, at = [], 0
    for count in [*per_read, len(chunks)]:
        if at < len(chunks):
            reads.append(b"".join(chunks[at : at + count]))
            at += count

    async def scenario() -> list[bytes]:
        proto = httpparse.StreamProtocol()
        proto.connection_made(NoTransport())  # type: ignore[arg-type]
        got: list[bytes] = []
        done = proto.send(b"", lambda payload, _: got.append(payload))
        proto.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   b"transfer-encoding: chunked\r\n\r\n", 0.0)  # fmt: skip
        for data in reads:
            proto.feed(data, 0.0)
        await asyncio.wait_for(done, 1)
        return got

    assert asyncio.run(scenario()) == events


def test_garbage_instead_of_http_is_an_error_not_a_hang():
    async def scenario() -> str:
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(httpparse.StreamProtocol, sock=ours)
        done = proto.send(b"GET / HTTP/1.1\r\n\r\n", lambda p, t: None)
        theirs.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        try:
            await asyncio.wait_for(done, 5)
        except httpparse.HTTPStreamError as exc:
            return str(exc)
        finally:
            theirs.close()
        return "no error"

    assert asyncio.run(scenario()).startswith("malformed HTTP response: not an HTTP/1.x status")


@pytest.mark.exclusive  # a server descheduled between its clock and its write reads as error
def test_a_busy_client_does_not_inflate_itl(sim_server):
    """Kernel receive timestamps: a client whose loop is blocked 8 ms at a time still measures
    the gaps the server sent; timing reads by the loop (https, non-Linux) cannot. (Blocks
    longer than a token gap would merge chunks into one read, one timestamp: no client can
    time those apart.)"""
    server = sim_server()

    async def measure(kernel_timestamps: bool) -> tuple[str, list[float]]:
        client = httpstream.StreamClient(server.url, kernel_timestamps=kernel_timestamps)
        busy = True

        async def hog() -> None:  # a client with other work: reads wait up to 8 ms
            while busy:
                time.sleep(0.008)  # the rehearsal baseline's token gap at C=1 is ~16 ms
                await asyncio.sleep(0.003)

        hogging = asyncio.create_task(hog())
        events: list[tuple[bytes, float]] = []
        body = {"text": "x", "sampling_params": {"max_new_tokens": 30}, "stream": True}
        await client.post_stream("/generate", body, lambda p, t: events.append((p, t)), 30)
        busy = False
        await hogging
        client.close()
        chunks = [(p, t) for p, t in events if p != b"[DONE]"]
        return json.loads(chunks[0][0])["meta_info"]["id"], [t for _, t in chunks]

    def worst_gap_error(rid: str, times: list[float]) -> float:
        with urllib.request.urlopen(f"{server.url}/sim/trace/{rid}", timeout=5) as r:
            sent = json.loads(r.read())["sent_times"]
        assert len(sent) == len(times) == 30
        ours = [b - a for a, b in itertools.pairwise(times)]
        truth = [b - a for a, b in itertools.pairwise(sent)]
        # two chunks in one read share its timestamp (a stalled server caught up while the
        # loop was blocked): nobody can time those apart, so they are not counted, but they
        # must stay rare
        pairs = [(a, b) for a, b in zip(ours, truth, strict=True) if a != 0.0]
        assert len(pairs) >= 25, (ours, truth)
        return max(abs(a - b) for a, b in pairs)

    kernel = worst_gap_error(*run_async(measure(True)))
    loop_timed = worst_gap_error(*run_async(measure(False)))
    assert loop_timed > 0.004  # the hog really delays reads
    assert kernel < 0.002, (kernel, loop_timed)


def test_a_prompt_larger_than_the_socket_buffer_is_sent_whole(uvicorn_url):
    # 8 MB does not fit one non-blocking send: the rest goes through the event loop
    run = level(uvicorn_url, n=2, c=2, out=5, prompts_text="word " * 1_600_000)
    assert [(r.ok, r.completion_tokens) for r in run.records] == [(True, 5), (True, 5)]


def _feed_raw(raw_parts: list[bytes]) -> str:
    """Send raw bytes as a server would; the error the client reports, or 'no error'."""

    async def scenario() -> str:
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(httpparse.StreamProtocol, sock=ours)
        done = proto.send(b"POST / HTTP/1.1\r\n\r\n", lambda p, t: None)
        try:
            for part in raw_parts:
                if done.done():
                    break
                try:
                    await loop.sock_sendall(theirs, part)
                except OSError:  # the client gave up on this connection: it said why
                    break
            await asyncio.wait_for(done, 10)
        except httpparse.HTTPStreamError as exc:
            return str(exc)
        finally:
            proto.abort()
            theirs.close()
        return "no error"

    return asyncio.run(scenario())


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def test_an_endless_event_is_refused_at_16_mib_not_buffered():
    # 1 MiB chunks of one event that never ends: refused once it passes 16 MiB
    piece = b"x" * (1024 * 1024)
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    error = _feed_raw([SSE_HEAD + b"%x\r\ndata: \r\n" % 6] + [chunk] * 20)
    assert error == "malformed HTTP response: server-sent event over 16 MiB"


def test_oversized_chunk_and_endless_size_line_are_refused():
    error = _feed_raw([SSE_HEAD + b"%x\r\n" % (64 * 1024 * 1024)])
    assert error == f"malformed HTTP response: chunk of {64 * 1024 * 1024} bytes (over 16 MiB)"
    error = _feed_raw([SSE_HEAD + b"f" * (70 * 1024)])
    assert error == "malformed HTTP response: chunk size line over 64 KiB"


@pytest.mark.parametrize(
    "layout",
    [
        b'{"text":"x","meta_info":{"id":"a","completion_tokens":%d,"cached_tokens":0}}',
        b'{"text":"x","meta_info":{"id":"a","cached_tokens":0,"completion_tokens":%d}}',
        b'{"text": "x", "meta_info": {"completion_tokens": %d, "spec_verify_ct": 2}}',
        b'{"text":"\\"completion_tokens\\":99","meta_info":{"completion_tokens":%d}}',
    ],
)
def test_completion_tokens_are_read_from_any_layout_sglang_sends(layout):
    from gpufleet.host.bench.dialects import DIALECTS
    from gpufleet.host.bench.level import RequestRecord

    record = RequestRecord(0)
    tracker = DIALECTS["sglang"].reader(record, 0.0)
    for total, now in ((1, 0.1), (3, 0.4), (4, 0.5)):
        tracker.on_event(layout % total, now)
    assert tracker.seen_tokens == 4 and record.chunks == 3
    tracker.count(0, None)  # the gaps are decided at the end (host/bench/tokencount.py)
    assert record.itl == pytest.approx([0.15, 0.15, 0.1])
    expected_verify = 2 if b"spec_verify_ct" in layout else None
    assert tracker.spec_verify_ct() == expected_verify


def test_a_finished_level_has_a_short_repr():
    """asyncio.run (3.11) formats the main task's result when it restores SIGINT: a repr of
    every record and gap cost ~1 us per streamed token."""
    from gpufleet.host.bench.level import LevelRun, RequestRecord

    records = [RequestRecord(i, itl=[0.01] * 256) for i in range(1000)]
    assert len(repr(LevelRun(64, float("inf"), 10.0, records, 0.0))) < 200
