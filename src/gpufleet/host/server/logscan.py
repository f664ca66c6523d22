"""Reading a server's log while it grows: wait-ready's scan for fatal lines and `logs
--follow`. The log is written by the server (as the run_as user, where one is set): a log
extended by a 1 GiB hole once drove root's agent to 3.1 GiB (issue 80). So each look reads
at most the newest `bounded.LOG_LOOK` bytes of what the log gained (the rest is skipped
by seeking, and said), and each line is at most `bounded.LOG_LINE` characters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from gpufleet.host.agent import bounded

FATAL_PATTERNS = [
    ("Traceback (most recent call last)", "Python traceback"),
    ("Initialization failed", "initialization failed"),
    ("CUDA out of memory", "CUDA out of memory"),
    ("OutOfMemoryError", "out of memory"),
    ("address already in use", "address already in use"),
    ("[Errno 98]", "address already in use"),
]


def skipped_line(skipped: int) -> str:
    return (
        f"[gpufleet] {skipped} bytes of the log skipped: it gained more than "
        f"{bounded.mib(bounded.LOG_LOOK)} at once (read: the newest)"
    )


class LogScanner:
    """Reads what the server log gained since the last look: fatal lines and the last line."""

    def __init__(self, path: str, offset: int) -> None:
        self.path = path
        self.offset = offset
        self.last_line = ""

    def fatal(self) -> str | None:
        try:
            with open(self.path, "rb") as fh:
                chunk, self.offset, _ = bounded.newest(fh, self.offset, bounded.LOG_LOOK)
        except OSError:
            return None
        if not chunk:
            return None
        text = chunk.decode(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if lines:
            self.last_line = lines[-1][-200:]
        return next((label for needle, label in FATAL_PATTERNS if needle in text), None)


def follow(fh: BinaryIO, offset: int) -> tuple[list[str], int]:
    """The complete lines `fh` gained from `offset` on (each cut to LOG_LINE characters, a
    flood skipped to its newest LOG_LOOK bytes with one line saying so); the new offset.
    An unfinished last line waits for its end, unless it alone fills a look."""
    data, end, skipped = bounded.newest(fh, offset, bounded.LOG_LOOK)
    out = [skipped_line(skipped)] if skipped else []
    complete = data if len(data) >= bounded.LOG_LOOK else data[: data.rfind(b"\n") + 1]
    out.extend(_cut_lines(complete))
    return out, end - (len(data) - len(complete))


def _cut_lines(data: bytes) -> Iterator[str]:
    for line in data.decode(errors="replace").splitlines():
        yield bounded.cut(line)
