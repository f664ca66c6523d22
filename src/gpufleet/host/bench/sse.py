"""Server-sent events parsed as the HTML standard defines them (the "event stream
interpretation"), not as one engine happens to write them: lines end in CRLF, LF or a lone
CR (a CR that ends a read waits for the next one, which may hold its LF); a blank line
dispatches the event; a line starting with ':' is a comment; `field:value` drops one
space after the colon when there is one (`data:x` and `data: x` are the same); several
`data` lines join with LF; `event`, `id` and `retry` are kept; other fields are ignored.
An event of a type other than `message` (`event: error`) goes to `on_typed` when given, so
the dialect decides what it means (sender.py); without one it is read as data, as before.

Nearly every read while streaming is one `data: ...` event per HTTP chunk and takes the
fast path (bench/ssefast.py); this parser takes everything else, so what any engine sends
within the standard is read, and a stream that is not server-sent events at all is an
error on the request (httpstream.py), never tokens dropped without a word.
"""

from __future__ import annotations

import re
from collections.abc import Callable

LINE_END = re.compile(rb"\r\n|\r|\n")
MAX_EVENT = 16 * 1024 * 1024  # one event's pending bytes; SGLang's are a few KiB


class EventStream:
    """One response's event stream, fed as bytes arrive; each event's data goes to
    `on_event(data, at)`."""

    def __init__(
        self,
        on_event: Callable[[bytes, float], None] | None,
        on_typed: Callable[[bytes, bytes, float], None] | None = None,
    ) -> None:
        self.on_event = on_event
        self.on_typed = on_typed  # (event type, data, time) of an event not `message`
        self.events = 0  # dispatched, the fast path's included (httpstream counts those)
        self.event_type = b""
        self.last_id = b""
        self.retry_ms: int | None = None
        self._pending = b""  # an unfinished line
        self._data: list[bytes] = []
        self._size = 0

    @property
    def idle(self) -> bool:
        """Between events: nothing pending (an `event:` line included, which types the
        next data), so a whole event chunk may skip this parser."""
        return not self._pending and not self._data and not self.event_type

    def feed(self, data: bytes, now: float) -> None:
        buf = self._pending + data if self._pending else data
        pos, size = 0, len(buf)
        while True:
            end = LINE_END.search(buf, pos)
            if end is None or (end.group() == b"\r" and end.end() == size):
                break  # no line end yet, or a CR whose LF may be in the next read
            self._line(buf[pos : end.start()], now)
            pos = end.end()
        self._pending = buf[pos:]
        if len(self._pending) + self._size > MAX_EVENT:
            raise ValueError("server-sent event over 16 MiB")

    def close(self, now: float) -> None:
        """The response ended: a last line and event without their blank line are still
        read (the standard drops them; a server that ends that way would lose its last
        tokens)."""
        if self._pending:
            self._line(self._pending.rstrip(b"\r"), now)
            self._pending = b""
        self._dispatch(now)

    def _line(self, line: bytes, now: float) -> None:
        if not line:
            self._dispatch(now)
            return
        if line[:1] == b":":
            return  # a comment (keep-alives are sent this way)
        field, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._size += len(value) + 1
        elif field == b"event":
            self.event_type = value
        elif field == b"id":
            if b"\0" not in value:
                self.last_id = value
        elif field == b"retry" and value.isdigit():
            self.retry_ms = int(value)

    def _dispatch(self, now: float) -> None:
        data, self._data, self._size = self._data, [], 0
        kind, self.event_type = self.event_type, b""
        if not data:
            return  # the standard: an event without data is not dispatched
        self.events += 1
        if kind not in (b"", b"message") and self.on_typed is not None:
            self.on_typed(kind, b"\n".join(data), now)
        elif self.on_event is not None:
            self.on_event(b"\n".join(data), now)
