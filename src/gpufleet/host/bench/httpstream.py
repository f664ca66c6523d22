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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from gpufleet.host.bench import ssefast
from gpufleet.host.bench.sse import EventStream

EventHandler = Callable[[bytes, float], None]  # (payload after "data: ", perf_counter time)
TypedHandler = Callable[[bytes, bytes, float], None]  # (`event:` type, payload, time)
Handlers = tuple[EventHandler, TypedHandler | None]
MAX_ERROR_BODY = 64 * 1024
MAX_LINE = 64 * 1024  # a chunk-size or trailer line; real ones are a few bytes
MAX_EVENT = 16 * 1024 * 1024  # one chunk or one SSE event; SGLang's are a few KiB


class HTTPStreamError(Exception):
    """The connection broke or the server answered with something that is not HTTP/1.x."""


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


@dataclass
class Response:
    status: int = 0
    reason: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""  # kept only for non-SSE answers (errors), at most MAX_ERROR_BODY
    streamed: int = 0  # event-stream bytes that went through the full parser

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


class _StreamProtocol(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.keep_alive = True
        self._buf = b""
        self._events = EventStream(None)
        self._state = "idle"
        self._need = 0
        self._body_mode = ""
        self._sse_mode: bool | None = None
        self._response = Response()
        self._on_event: EventHandler | None = None
        self._done: asyncio.Future[Response] | None = None
        self.received_any = False

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == "body" and self._body_mode == "close":
            self._finish()
            return
        if self._done is not None and not self._done.done():
            reason = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection"
            self._done.set_exception(HTTPStreamError(reason))

    def data_received(self, data: bytes) -> None:
        self.feed(data, time.perf_counter())

    def feed(self, data: bytes, now: float) -> None:
        """Bytes of the response, which arrived at `now` (perf_counter seconds)."""
        self.received_any = True
        if self._state == "size" and self._sse_mode and not self._buf and self._events.idle:
            on_event = self._on_event
            event = ssefast.one_event_chunk(data)
            if event is not None:  # the usual read while streaming: nothing left over
                self._events.events += 1
                if on_event is not None:
                    on_event(event, now)
                return
            events = ssefast.event_chunks(data)
            if events is not None:
                self._events.events += len(events)
                if on_event is not None:
                    for event in events:
                        on_event(event, now)
                return
        self._buf += data
        try:
            self._parse(now)
        except (ValueError, IndexError) as exc:
            self._fail(HTTPStreamError(f"malformed HTTP response: {exc}"))

    # -- requests ----------------------------------------------------------------------
    def send(self, request: bytes, on_event: EventHandler,
             on_typed: TypedHandler | None = None) -> asyncio.Future[Response]:  # fmt: skip
        self._on_event = on_event
        self._response = Response()
        self._buf = b""
        self._events = EventStream(on_event, on_typed)
        self._sse_mode = None
        self._body_mode = ""
        self._state = "head"
        self.received_any = False
        self._done = asyncio.get_running_loop().create_future()
        self._write(request)
        return self._done

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- parsing -----------------------------------------------------------------------
    def _parse(self, now: float) -> None:
        while self._buf or self._state == "body-done":
            state = self._state
            if state == "head":
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > 65536:
                        raise ValueError("response head over 64 KiB")
                    return
                self._head(self._buf[:end].decode("latin-1"))
                self._buf = self._buf[end + 4 :]
            elif state == "size":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_LINE:
                        raise ValueError("chunk size line over 64 KiB")
                    return
                size = int(self._buf[:end].split(b";", 1)[0], 16)
                if size > MAX_EVENT:
                    raise ValueError(f"chunk of {size} bytes (over 16 MiB)")
                self._buf = self._buf[end + 2 :]
                if size == 0:
                    self._state = "trailer"
                else:
                    self._need, self._state = size, "chunk"
            elif state == "chunk":
                if len(self._buf) < self._need + 2:
                    return
                self._body(self._buf[: self._need], now)
                self._buf = self._buf[self._need + 2 :]
                self._state = "size"
            elif state == "trailer":
                end = self._buf.find(b"\r\n")
                if end < 0:
                    if len(self._buf) > MAX_LINE:
                        raise ValueError("trailer line over 64 KiB")
                    return
                line, self._buf = self._buf[:end], self._buf[end + 2 :]
                if not line:
                    self._finish()
            elif state == "body":
                if self._body_mode == "length":
                    take = self._buf[: self._need]
                    self._buf = self._buf[self._need :]
                    self._need -= len(take)
                    self._body(take, now)
                    if self._need == 0:
                        self._finish()
                else:  # until the server closes
                    take, self._buf = self._buf, b""
                    self._body(take, now)
            elif state == "body-done":
                self._finish()
            else:  # idle: bytes nobody asked for
                raise ValueError(f"{len(self._buf)} unexpected bytes between responses")

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        code, _, reason = rest.partition(" ")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        resp = self._response
        resp.status, resp.reason, resp.headers = int(code), reason, headers
        connection = headers.get("connection", "").lower()
        self.keep_alive = connection != "close" and not (
            version == "HTTP/1.0" and connection != "keep-alive"
        )
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = "size"
        elif "content-length" in headers:
            self._need = int(headers["content-length"])
            self._body_mode = "length"
            self._state = "body" if self._need else "body-done"
        elif resp.status in (204, 304) or 100 <= resp.status < 200:
            self._state = "body-done"
        else:
            self._body_mode, self._state = "close", "body"
            self.keep_alive = False

    def _body(self, data: bytes, now: float) -> None:
        resp = self._response
        if self._sse_mode is None:  # first body bytes: an event stream, or an answer to keep
            self._sse_mode = resp.status == 200 and (
                "text/event-stream" in resp.headers.get("content-type", "")
                or data.startswith(b"data:")
            )
        if not self._sse_mode:
            if len(resp.body) < MAX_ERROR_BODY:
                resp.body += data[: MAX_ERROR_BODY - len(resp.body)]
            return
        self._response.streamed += len(data)
        self._events.feed(data, now)

    def _finish(self) -> None:
        self._state = "idle"
        events = self._events
        if self._sse_mode:
            events.close(time.perf_counter())
        self._events = EventStream(None)
        if self._done is None or self._done.done():
            return
        if self._sse_mode and self._response.streamed and not events.events:
            self._done.set_exception(HTTPStreamError(
                f"an event stream of {self._response.streamed} bytes held no data events: "
                "not server-sent events as the standard defines them"
            ))  # fmt: skip
            return
        self._done.set_result(self._response)

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self.abort()


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; Python does not export it
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)
_READ_SIZE = 64 * 1024


class _KernelTimedConnection(_StreamProtocol):
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
        self._idle: list[_StreamProtocol] = []

    async def _connect(self) -> _StreamProtocol:
        loop = asyncio.get_running_loop()
        if self.kernel_timestamps:
            return await asyncio.wait_for(self._connect_timed(loop), self.connect_timeout)
        _, proto = await asyncio.wait_for(
            loop.create_connection(_StreamProtocol, self.host, self.port, ssl=self.ssl),
            self.connect_timeout,
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
        typed other than `message`); returns at the end."""
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
        return await self._exchange(await self._connect(), request, handlers, timeout)

    async def _exchange(
        self, proto: _StreamProtocol, request: bytes, handlers: Handlers, timeout: float
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
