"""Every read of what a server, a log, another user or /proc hands the agent, bounded.

An endless /server_info body once drove root's bench runner to 12.5 GiB, and a log
extended by a 1 GiB hole drove root's agent to 3.1 GiB during launch (issue 80): a
server, its log and its run_as user are untrusted, and so is the size of what they give.
The bounds are stated here, once; tests/test_bounded_reads.py feeds each reader an
endless or huge input and checks the peak memory, and a census there fails on a read in
host/ that goes around this module without a stated reason. Standard library only.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

HTTP_BODY = 1 << 20  # a server's JSON answer: /server_info, a model list, an error body
METRICS_PAGE = 4 << 20  # one Prometheus /metrics page (SGLang's is tens of KiB)
PROGRAM_OUTPUT = 4 << 20  # what an engine's probe prints (--help, --version), each stream
PROC_FILE = 1 << 20  # one /proc file read whole (cmdline, environ, status)
PROC_LINE = 4 << 10  # one line of a /proc table (/proc/net/tcp's are 150 bytes)
LOG_LOOK = 1 << 20  # what a log scanner reads of what the log gained, per look: the newest
RUN_LOOK = 1 << 20  # what a watch reads of a runner's progress.jsonl or status.json, per look
LOG_LINE = 16 << 10  # one log line as it is followed or tailed; the rest is cut, said so
ANSWER_TEXT = 4 << 20  # a streamed answer's text a multi-turn session keeps for its next turn
ANSWER_SLACK = 1024  # tokens a streamed answer may count beyond twice those it was asked for
CHUNK = 64 << 10


class TooLarge(ValueError):
    """More than the bound: nothing of it was kept."""


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def mib(limit: int) -> str:
    """A bound as the one-line refusals say it."""
    return f"{limit / (1 << 20):g} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def take(stream: Readable, limit: int) -> bytes:
    """The first `limit` bytes of `stream` (fewer where it ends first), read in chunks."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        data = stream.read(min(CHUNK, limit - got))
        if not data:
            break
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def read(stream: Readable, limit: int, what: str = "the answer") -> bytes:
    """All of `stream` where it holds at most `limit` bytes; TooLarge where more follow."""
    data = take(stream, limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{what} is over {mib(limit)}: not read")
    return data


def read_file(path: str | os.PathLike[str], limit: int, what: str | None = None) -> bytes:
    """A file's bytes, at most `limit` (TooLarge where it holds more; OSError as open's)."""
    with open(path, "rb") as fh:
        return read(fh, limit, what or str(path))


def lines(fh: BinaryIO, limit: int) -> Iterator[bytes]:
    """A file's lines, each at most `limit` bytes (a longer one comes in pieces)."""
    while True:
        line = fh.readline(limit)
        if not line:
            return
        yield line


def cut(line: str, limit: int = LOG_LINE) -> str:
    """A line of at most `limit` characters; where cut, it says how much was left out."""
    if len(line) <= limit:
        return line
    return f"{line[:limit]} [gpufleet: {len(line) - limit} more characters cut]"


def newest(fh: BinaryIO, start: int, limit: int) -> tuple[bytes, int, int]:
    """What a file gained from `start` on, at most its newest `limit` bytes: (data, where
    reading ended, bytes skipped). Holes and floods are skipped by seeking, never read."""
    end = os.fstat(fh.fileno()).st_size
    if end < start:  # truncated or replaced: start over
        start = 0
    begin = max(start, end - limit)
    fh.seek(begin)
    data = take(fh, limit)
    return data, begin + len(data), begin - start


def count(fh: BinaryIO, start: int, end: int, needle: bytes) -> int:
    """How often `needle` occurs between two offsets of a file, read a chunk at a time and
    its holes skipped (a log's 1 GiB hole is no data to read), never held whole."""
    fd, found, pos, carry = fh.fileno(), 0, start, b""
    while pos < end:
        try:
            data_at = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: nothing but a hole from here
            break
        if data_at > pos:
            pos, carry = data_at, b""
            continue
        os.lseek(fd, pos, os.SEEK_SET)
        data = os.read(fd, min(CHUNK, end - pos))
        if not data:
            break
        window = carry + data  # a needle across two chunks is found in the second window
        found += window.count(needle)
        carry = window[-(len(needle) - 1) :] if len(needle) > 1 else b""
        pos += len(data)
    return found


@dataclass
class Output:
    """What a program printed, each stream at most the bound."""

    returncode: int
    stdout: str
    stderr: str


def run(
    argv: list[str], limit: int, timeout: float, *, env: dict[str, str], **popen: object
) -> Output:
    """Run a program and keep what it prints, each stream at most `limit` bytes: one that
    prints more is killed (TooLarge), as one that runs past `timeout` is
    (subprocess.TimeoutExpired). An engine's probe runs as the run_as user: its output is
    that user's to choose. `env` is required: every child of the agent gets the clean
    environment it was given (host/agent/childenv.py), never the agent's own."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, **popen)  # type: ignore[call-overload]
    fds = (proc.stdout.fileno(), proc.stderr.fileno())  # type: ignore[union-attr]
    kept: dict[int, list[bytes]] = {fd: [] for fd in fds}
    sizes = dict.fromkeys(kept, 0)
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel, proc:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                raise subprocess.TimeoutExpired(argv, timeout)
            for key, _ in sel.select(min(left, 1.0)):
                data = os.read(key.fd, CHUNK)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                sizes[key.fd] += len(data)
                if sizes[key.fd] > limit:
                    proc.kill()
                    raise TooLarge(f"`{argv[0]}` printed more than {mib(limit)}: stopped, not read")
                kept[key.fd].append(data)
        try:
            code = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # its streams closed, it runs on
            proc.kill()
            raise
    out, err = (b"".join(kept[fd]).decode(errors="replace") for fd in fds)
    return Output(code, out, err)
