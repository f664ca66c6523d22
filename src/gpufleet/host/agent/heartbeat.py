"""A serving agent's stdout, one whole line at a time, and its heartbeat.

The control plane reads a verb's answer with a limit on silence (SILENT_S), not on the
verb's length: `logs --follow` on a quiet log may say nothing for hours, and an agent a
user stopped (SIGSTOP), a hung host or a lost network said nothing forever while `inv
logs` waited. So while a serving agent runs a verb, a thread writes a heartbeat line
whenever nothing else was written for HEARTBEAT_S; where that write fails, the task's
connection is gone and the agent ends (a quiet verb, `bench-watch` on a stopped run, held
the host for a task that no longer was). Standard library only: this module ships.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

HEARTBEAT_S = 5.0  # a serving agent busy in a verb says it is alive this often
# the control plane's limit on silence from a serving agent in a verb: several heartbeats
SILENT_S = 30.0
ALIVE = "alive"  # a heartbeat line's key: {MARK: 1, "alive": 1}

_writing = threading.Lock()
_last_write = [0.0]  # monotonic time of the last line written


def write(line: str) -> None:
    """One whole line to stdout (the heartbeat writes from its own thread)."""
    with _writing:
        sys.stdout.write(line)
        sys.stdout.flush()
        _last_write[0] = time.monotonic()


class Heartbeat:
    """While a serving agent runs a verb: `{mark: 1, "alive": 1}` whenever nothing else was
    written for `every` seconds."""

    def __init__(self, mark: str, every: float = HEARTBEAT_S) -> None:
        self.line = json.dumps({mark: 1, ALIVE: 1}) + "\n"
        self.every = every
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _beat(self) -> None:
        while not self.done.wait(self.every / 4):
            if time.monotonic() - _last_write[0] >= self.every and not self.done.is_set():
                try:
                    write(self.line)
                except OSError:  # the task's connection is gone: nothing to answer, and
                    os._exit(0)  # what the agent holds (the host: ownership.py) is let go
