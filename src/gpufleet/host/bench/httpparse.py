"""The response side of host/bench/httpstream.py's client: an HTTP/1.1 response read in the
transport's read callback (status line, headers, chunked or sized framing) and its
server-sent events handed, with the time their bytes arrived, to the request's callbacks.
Every line and event is bounded (MAX_LINE, MAX_EVENT, MAX_ERROR_BODY): the server is
untrusted. Split from the client (connections, pooling, kernel timestamps) by job.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

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


class StreamProtocol(asyncio.Protocol):
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
                head = self._line(b"\r\n\r\n", "response head")
                if head is None:
                    return
                self._head(head.decode("latin-1"))
            elif state == "size":
                line = self._line(b"\r\n", "chunk size line")
                if line is None:
                    return
                size = int(line.split(b";", 1)[0], 16)
                if size > MAX_EVENT:
                    raise ValueError(f"chunk of {size} bytes (over 16 MiB)")
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
                line = self._line(b"\r\n", "trailer line")
                if line is None:
                    return
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

    def _line(self, end: bytes, what: str) -> bytes | None:
        """The buffer up to `end` (a line, or the head up to its blank line), taken off it
        with `end`; None until it has come. `what` past MAX_LINE without its end: refused."""
        at = self._buf.find(end)
        if at < 0:
            if len(self._buf) > MAX_LINE:
                raise ValueError(f"{what} over 64 KiB")
            return None
        line, self._buf = self._buf[:at], self._buf[at + len(end) :]
        return line

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
