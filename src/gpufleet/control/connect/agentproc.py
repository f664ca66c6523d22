"""One running agent on a host, read by waiting on its output, never in a sleep loop.

An `AgentProcess` is a remote command over the task's SSH connection (one channel) or a
local `sh -c`. transport.Session starts one `serve` agent per host per task and sends it
verb after verb. Reading blocks in select() until the agent writes: at 128 hosts the
control plane's CPU per host is the budget, and Invoke's runner polls every 10 ms in
three threads per command.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

from paramiko import Channel, Transport

FINAL = "final"  # the condition the caller waited for holds
EOF = "eof"  # the agent closed its output (exited, or the connection is gone)
TIMEOUT = "timeout"
CHUNK = 65536
WAKE_S = 5.0  # re-check a silent SSH transport this often (a dead peer sends nothing)


class Sink(Protocol):
    def write(self, text: str) -> int: ...


class AgentProcess:
    """What Session needs of a running agent; subclasses say how bytes move."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stderr = bytearray()

    def send(self, text: str) -> None:
        raise NotImplementedError

    def close_stdin(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
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


class SSHAgent(AgentProcess):
    """The agent as one exec channel of an open SSH transport."""

    def __init__(self, transport: Transport, script: str) -> None:
        super().__init__()
        self.transport = transport
        self.chan: Channel = transport.open_session(timeout=30)
        self.chan.exec_command(script)

    def send(self, text: str) -> None:
        self.chan.sendall(text.encode())

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.chan.shutdown_write()

    def kill(self) -> None:
        self.chan.close()

    @property
    def lost(self) -> bool:
        return not self.transport.is_active()

    def _drain_stderr(self) -> None:
        while self.chan.recv_stderr_ready():
            self._stderr += self.chan.recv_stderr(CHUNK)

    def _read(self, timeout: float) -> bytes | None:
        self._drain_stderr()
        if not self.chan.recv_ready() and not self.chan.closed:
            select.select([self.chan], [], [], timeout)
            self._drain_stderr()
            if not self.chan.recv_ready() and not self.chan.eof_received:
                return None if not self.chan.closed else b""
        data = self.chan.recv(CHUNK)
        if not data:
            self._drain_stderr()
        return data

    def exit_code(self) -> int | None:
        if not self.chan.status_event.wait(timeout=10):
            return None
        self._drain_stderr()
        code = self.chan.exit_status
        return None if code < 0 else code


class LocalAgent(AgentProcess):
    """`connection: local`: the same bootstrap run by `sh` here (or, given `argv`, by a
    command that runs it elsewhere: `srun ... /bin/sh -c SCRIPT`)."""

    def __init__(
        self, script: str, argv: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        super().__init__()
        self.proc = subprocess.Popen(
            argv or ["sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self._err_reader = threading.Thread(target=self._collect_stderr, daemon=True)
        self._err_reader.start()

    def _collect_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(CHUNK), b""):  # type: ignore[union-attr]
            self._stderr += chunk

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        self.close_stdin()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def _read(self, timeout: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, CHUNK) if ready else None

    def exit_code(self) -> int | None:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None
        self._err_reader.join(timeout=5)
        return code
