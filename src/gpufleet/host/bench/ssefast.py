"""The fast paths of reading server-sent events out of chunked HTTP: a read that is exactly
whole chunks of one `data: ...` event each (nearly every read while streaming) is split
with a few scans done in C; anything else returns None and goes through the full parser
(bench/httpstream.py)."""

from __future__ import annotations


def one_event_chunk(data: bytes) -> bytes | None:
    """The payload when `data` is exactly one HTTP chunk of one `data: ...\n\n` event, else None.

    Nearly every read while streaming is one (SGLang sends an event per chunk and a chunk per
    decode step; 99% of reads at C=64 when the client keeps up), so it is checked with a few
    scans done in C, one of them a memchr for a second event: no splitting, no copy but the
    payload's. Anything else returns None (see event_chunks).
    """
    nl = data.find(b"\r\n", 0, 18)
    if nl <= 0 or not data.endswith(b"\n\n\r\n") or not data.startswith(b"data: ", nl + 2):
        return None
    try:
        size = int(data[:nl], 16)
    except ValueError:
        return None
    start, end = nl + 8, len(data) - 4
    if nl + 4 + size != len(data) or data.find(b"\n", start, end) >= 0:
        return None
    if data.find(b"\r", start, end) >= 0:
        return None
    return data[start:end]


def event_chunks(data: bytes) -> list[bytes] | None:
    """The payloads when `data` is whole HTTP chunks of one `data: ...\n\n` event each, else None.

    The reads of a client that fell behind (several decode steps queued in the socket); the
    same checks as one_event_chunk, chunk by chunk. A partial chunk, the last chunk, CRLF
    separators or extensions return None and go through the full parser.
    """
    events: list[bytes] = []
    pos, total = 0, len(data)
    while pos < total:
        nl = data.find(b"\r\n", pos, pos + 18)
        if nl <= pos or not data.startswith(b"data: ", nl + 2):
            return None
        try:
            size = int(data[pos:nl], 16)
        except ValueError:
            return None
        start, end = nl + 8, nl + size  # the chunk is data[nl + 2 : nl + 2 + size]
        if data[end : end + 4] != b"\n\n\r\n" or data.find(b"\n", start, end) >= 0:
            return None
        if data.find(b"\r", start, end) >= 0:
            return None
        events.append(data[start:end])
        pos = end + 4
    return events
