"""One running agent on a host, read by waiting on its output, never in a sleep loop.

An `AgentProcess` is a remote command over the task's SSH connection (one channel) or a
local `sh -c` (connect/ssh.py, connect/local.py, connect/srun.py). base.Session starts one
`serve` agent per host per task and sends it verb after verb. Reading blocks in select()
until the agent writes: at 128 hosts the control plane's CPU per host is the budget, and
Invoke's runner polls every 10 ms in three threads per command.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable
from typing import Protocol

from gpufleet.host.agent import heartbeat
from gpufleet.host.agent.protocol import MARK, FinalLine, Hello, ProgressEvent

FINAL = "final"  # the condition the caller waited for holds
EOF = "eof"  # the agent closed its output (exited, or the connection is gone)
TIMEOUT = "timeout"
SILENT = "silent"  # nothing at all came for the silence limit (not even a heartbeat)
CHUNK = 65536
WAKE_S = 5.0  # re-check a silent SSH transport this often (a dead peer sends nothing)


class Sink(Protocol):
    """Where an agent's output lines go."""

    def write(self, text: str) -> int:
        """Take some text; return how much was taken."""


EventHandler = Callable[[ProgressEvent], None]


class LineParser:
    """A file-like sink that splits agent stdout into JSON lines as they arrive."""

    def __init__(self, on_event: EventHandler | None) -> None:
        self.on_event = on_event
        self.buffer = ""
        self.final: FinalLine | None = None
        self.hello: Hello | None = None  # a serving agent's first line
        self.other: list[str] = []
        self.unreadable: str | None = None  # a line of ours that is not JSON: the answer is lost

    def write(self, text: str) -> int:
        """Take agent output; each complete line is parsed as it arrives."""
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            self._line(line)
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered but an incomplete line (a file-like sink's method)."""

    def close(self) -> None:
        """The output ended: a last line without its newline is parsed too."""
        if self.buffer:
            self._line(self.buffer)
            self.buffer = ""

    def _line(self, line: str) -> None:
        line = line.strip()
        if not line:
            return
        try:
            obj = json.loads(line)
        except ValueError:
            if MARK in line and self.unreadable is None:
                self.unreadable = line
            self.other.append(line)
            return
        if not isinstance(obj, dict) or obj.get(MARK) != 1:
            self.other.append(line)
        elif heartbeat.ALIVE in obj:
            pass  # the agent is busy in the verb, and alive
        elif "event" in obj:
            if self.on_event:
                self.on_event(obj["event"])
        elif "hello" in obj:
            self.hello = obj["hello"]
        else:
            self.final = obj


class AgentProcess:
    """What Session needs of a running agent; subclasses say how bytes move."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stderr = bytearray()

    def send(self, text: str) -> None:
        """Write to the agent's stdin (one verb per line)."""
        raise NotImplementedError

    def close_stdin(self) -> None:
        """No more verbs: the agent exits when it has answered."""
        raise NotImplementedError

    def kill(self) -> None:
        """End the agent now."""
        raise NotImplementedError

    def finish(self) -> None:
        """End an idle serving agent: its stdin ends, so it exits."""
        self.close_stdin()
        self.kill()

    def exit_code(self) -> int | None:
        """After EOF: the exit status, or None when the agent did not finish (lost, killed)."""
        raise NotImplementedError

    @property
    def lost(self) -> bool:
        """The way to the host is gone (not merely the agent)."""
        return False

    def stderr_text(self) -> str:
        """What the agent wrote on stderr, for a failure's one line."""
        return self._stderr.decode(errors="replace")

    def _read(self, timeout: float) -> bytes | None:
        """Up to CHUNK bytes of stdout (b"" at EOF), or None when nothing came in time."""
        raise NotImplementedError

    def pump(
        self,
        sink: Sink,
        deadline: float | None,
        until: Callable[[], bool],
        silent_s: float | None = None,
    ) -> str:
        """Feed stdout to `sink` until `until()` holds, the output ends, the deadline, or
        nothing at all came for `silent_s` (a serving agent's heartbeat says it is alive)."""
        heard = time.monotonic()
        while not until():
            now = time.monotonic()
            quiet = None if silent_s is None else heard + silent_s
            ends = [t for t in (deadline, quiet) if t is not None]
            wait = min([WAKE_S, *(t - now for t in ends)])
            if wait <= 0:
                return TIMEOUT if deadline is not None and now >= deadline else SILENT
            data = self._read(wait)
            if data is None:
                if self.lost:
                    return EOF
                continue
            heard = time.monotonic()
            if not data:
                sink.write(self._decoder.decode(b"", final=True))
                return EOF
            sink.write(self._decoder.decode(data))
        return FINAL
