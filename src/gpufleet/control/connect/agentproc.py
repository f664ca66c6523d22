"""One running agent on a host, read by waiting on its output, never in a sleep loop.

An `AgentProcess` is a remote command over the task's SSH connection (one channel) or a
local `sh -c` (connect/ssh.py, connect/local.py, connect/srun.py). base.Session starts one
`serve` agent per host per task and sends it verb after verb. Reading blocks in select()
until the agent writes: at 128 hosts the control plane's CPU per host is the budget, and
Invoke's runner polls every 10 ms in three threads per command.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable
from typing import Protocol

FINAL = "final"  # the condition the caller waited for holds
EOF = "eof"  # the agent closed its output (exited, or the connection is gone)
TIMEOUT = "timeout"
CHUNK = 65536
WAKE_S = 5.0  # re-check a silent SSH transport this often (a dead peer sends nothing)


class Sink(Protocol):
    """Where an agent's output lines go."""

    def write(self, text: str) -> int:
        """Take some text; return how much was taken."""


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

    def pump(self, sink: Sink, deadline: float | None, until: Callable[[], bool]) -> str:
        """Feed stdout to `sink` until `until()` holds, the output ends, or the deadline."""
        while not until():
            wait = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
            if wait <= 0:
                return TIMEOUT
            data = self._read(wait)
            if data is None:
                if self.lost:
                    return EOF
                continue
            if not data:
                sink.write(self._decoder.decode(b"", final=True))
                return EOF
            sink.write(self._decoder.decode(data))
        return FINAL
