"""A small HTTP/1.1 client for streamed (server-sent event) responses, built for measuring.

Why not aiohttp: at C=64 every streamed token is one TCP read, and aiohttp spends most of
the client's CPU per token waking a coroutine through its StreamReader. Here chunked framing
and SSE events are parsed in the read callback and each event goes, with the time its bytes
arrived, straight to a callback: no task wake-up per token.

"The time its bytes arrived" is the kernel's receive timestamp (SO_TIMESTAMPNS) on plain HTTP
on Linux, so a client that is itself busy does not inflate TTFT and ITL; elsewhere (https,
other systems) it is when the event loop read them. See benchmarks/bench_client.py.

Keep-alive connections are pooled; a reused connection the server had already closed is
retried once on a fresh one, as long as no byte of the response had arrived.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import sys
import time
import urllib.parse
from typing import TypedDict

from gpufleet.host.bench.httpparse import (
    EventHandler,
    Handlers,
    HTTPStreamError,
    Response,
    StreamProtocol,
    TypedHandler,
)


class RequestBody(TypedDict, total=False):
    """What the bench client posts (host/bench/sender._payload builds it): SGLang's
    /generate (`text` or `input_ids`, `sampling_params`) or an OpenAI completion or chat."""

    text: str
    input_ids: list[int]
    sampling_params: dict[str, int | float | bool]
    model: str
    prompt: str | list[int]
    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float
    ignore_eos: bool
    stream: bool
    stream_options: dict[str, bool]


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python does not export it
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_READ_SIZE = 64 * 1024


class _KernelTimedConnection(StreamProtocol):
    """A plain-HTTP connection read with recvmsg, so every read carries the kernel's receive time.

    The event loop may reach a socket late: at C=64 it reads 64 of them per decode step, and
    a busy client (or a busy machine) adds its own delay to every TTFT and ITL. SO_TIMESTAMPNS
    stamps the bytes when the kernel received them, so the timings are the wire's whatever
    the client's load. Same parser, same pool; only the reading differs.
    """

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.sock = sock
        self.loop = loop
        self._fd = sock.fileno()
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ_SIZE, _ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(exc)
            return
        if not data:
            self._close(None)
            return
        now = time.perf_counter()
        if ancillary:
            sec, nsec = _TIMESPEC.unpack_from(ancillary[0][2])
            age = time.time() - (sec + nsec * 1e-9)  # how long the bytes waited for us
            if 0.0 < age < 10.0:
                now -= age
        self.feed(data, now)

    def _write(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close(exc)
            return
        if sent < len(data):  # a large prompt: let the loop finish it
            rest = asyncio.ensure_future(self.loop.sock_sendall(self.sock, data[sent:]))
            rest.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._close(task.exception())  # type: ignore[arg-type]

    def _close(self, exc: BaseException | None) -> None:
        if not self.closed:
            self.abort()
            self.connection_lost(exc if isinstance(exc, Exception) else None)

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self._fd)
            self.sock.close()


class StreamClient:
    """POST JSON to one server and stream the SSE answer to a callback, over pooled keep-alive."""

    def __init__(
        self,
        base_url: str,
        connect_timeout: float = 30.0,
        kernel_timestamps: bool = True,
        headers: dict[str, str] | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s)://host[:port] URL, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rpartition("@")[2]
        self.connect_timeout = connect_timeout
        self.extra_head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        # kernel receive timestamps need a socket we read ourselves: plain HTTP on Linux
        self.kernel_timestamps = (
            kernel_timestamps and self.ssl is None and sys.platform.startswith("linux")
        )
        self._idle: list[StreamProtocol] = []

    async def _connect(self, within: float) -> StreamProtocol:
        loop = asyncio.get_running_loop()
        if self.kernel_timestamps:
            return await asyncio.wait_for(self._connect_timed(loop), within)
        _, proto = await asyncio.wait_for(
            loop.create_connection(StreamProtocol, self.host, self.port, ssl=self.ssl), within
        )
        return proto

    async def _connect_timed(self, loop: asyncio.AbstractEventLoop) -> _KernelTimedConnection:
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        last: OSError | None = None
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            return _KernelTimedConnection(sock, loop)
        raise last or OSError(f"cannot resolve {self.host}")

    def _request(self, path: str, body: RequestBody) -> bytes:
        data = json.dumps(body).encode()
        head = (
            f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            f"User-Agent: gpufleet\r\n{self.extra_head}"
            "Accept: text/event-stream, application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        )
        return head.encode("latin-1") + data

    async def post_stream(
        self, path: str, body: RequestBody, on_event: EventHandler, timeout: float,
        on_typed: TypedHandler | None = None,
    ) -> Response:  # fmt: skip
        """Send; `on_event` gets every SSE `data:` payload as it arrives (`on_typed`: events
        typed other than `message`); returns at the end. `timeout` is the whole request's,
        connecting included (one deadline, no task of its own: a request is one task)."""
        deadline = time.monotonic() + timeout
        request = self._request(path, body)
        handlers = (on_event, on_typed)
        while self._idle:
            proto = self._idle.pop()
            if proto.closed:
                continue
            try:
                return await self._exchange(proto, request, handlers, timeout)
            except HTTPStreamError:
                if proto.received_any:
                    raise
                # the server had closed this idle connection: try a fresh one
        proto = await self._connect(min(self.connect_timeout, timeout))
        return await self._exchange(proto, request, handlers, max(0.0, deadline - time.monotonic()))

    async def _exchange(
        self, proto: StreamProtocol, request: bytes, handlers: Handlers, timeout: float
    ) -> Response:
        try:
            response = await asyncio.wait_for(proto.send(request, *handlers), timeout)
        except BaseException:
            proto.abort()
            raise
        if proto.keep_alive and not proto.closed:
            self._idle.append(proto)
        else:
            proto.abort()
        return response

    def close(self) -> None:
        for proto in self._idle:
            proto.abort()
        self._idle.clear()
