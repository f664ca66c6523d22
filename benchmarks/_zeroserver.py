"""A server that costs (almost) nothing, for measuring the client: SGLang's `/generate`
stream (`data: {json}` events, cumulative text, meta_info.completion_tokens, `[DONE]`) from
several processes on one port (SO_REUSEPORT). One ticker per process sends every open
stream its next token each PACE_MS (one timer, whatever the concurrency, and pre-built
events), and each token's send time is written to TRACE_DIR/<rid>.json when its request
ends: the ground truth of ITL error, whichever process served it.

Run by benchmarks/client_ceiling.py: python benchmarks/_zeroserver.py PORT PACE_MS TRACE_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from itertools import count

RID = b"RRRRRRRRRRRRRRRR"  # a fixed-width placeholder: each event is built once per length
_ids = count()


def _events(n: int) -> list[tuple[bytes, bytes]]:
    """(before the rid, after it) of each chunk-framed event 1..n."""
    out = []
    for i in range(1, n + 1):
        meta = {"id": RID.decode(), "prompt_tokens": 8, "completion_tokens": i, "cached_tokens": 0}
        event = f"data: {json.dumps({'text': 'x' * i, 'meta_info': meta, 'index': 0})}\n\n"
        data = event.encode()
        framed = b"%x\r\n%s\r\n" % (len(data), data)
        head, _, tail = framed.partition(RID)
        out.append((head, tail))
    return out


class Streams:
    """Every open stream of this process, advanced one token per tick."""

    def __init__(self, pace: float, traces: str) -> None:
        self.pace, self.traces = pace, traces
        self.open: list[list] = []  # [writer, rid, events, sent, times, done]
        self.cache: dict[int, list[tuple[bytes, bytes]]] = {}

    def add(self, writer: asyncio.StreamWriter, n: int) -> asyncio.Future:
        rid = f"{os.getpid() % 10**6:06d}{next(_ids):010d}".encode()
        events = self.cache.get(n) or self.cache.setdefault(n, _events(n))
        done = asyncio.get_running_loop().create_future()
        self.open.append([writer, rid, events, 0, [], done])
        return done

    async def tick(self) -> None:
        done_event = b"data: [DONE]\n\n"
        closing = b"%x\r\n%s\r\n0\r\n\r\n" % (len(done_event), done_event)
        next_at = time.perf_counter()
        while True:  # on a fixed grid: a late tick does not push the next ones back
            next_at += self.pace
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            still, finished = [], []
            for stream in self.open:
                writer, rid, events, sent, times, done = stream
                head, tail = events[sent]
                writer.write(head + rid + tail)
                times.append(time.perf_counter())  # when this stream's token really left
                stream[3] = sent + 1
                if stream[3] == len(events):
                    writer.write(closing)
                    finished.append(stream)
                else:
                    still.append(stream)
            self.open = still
            for _, rid, _, _, times, done in finished:  # after the tick's writes
                with open(os.path.join(self.traces, f"{rid.decode()}.json"), "w") as fh:
                    json.dump(times, fh)
                done.set_result(None)


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, streams: Streams
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            body = await reader.readexactly(int(headers.get("content-length", 0) or 0))
            if method == "POST" and path.endswith("/generate"):
                params = json.loads(body or b"{}").get("sampling_params", {})
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
                await streams.add(writer, int(params.get("max_new_tokens", 16)))
                await writer.drain()
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int, pace_ms: float, traces: str) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    streams = Streams(pace_ms / 1000, traces)
    ticker = asyncio.create_task(streams.tick())
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, streams), sock=sock, limit=1 << 20
    )
    async with server:
        await server.serve_forever()
    ticker.cancel()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
