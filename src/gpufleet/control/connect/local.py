"""`connection: local`: the agent run by `sh` on this machine, with no SSH: its session,
its agent process (a subprocess) and its file tree (this machine's, for the judge)."""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import stat
import subprocess
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

from gpufleet.control.agent import python_trust as interpreter
from gpufleet.control.connect.agentproc import CHUNK, AgentProcess
from gpufleet.control.connect.base import PIECE, Session
from gpufleet.errors import HostError
from gpufleet.kinds import Kind


class LocalTree:
    """This machine's filesystem (connection: local)."""

    lstat = staticmethod(os.lstat)
    readlink = staticmethod(os.readlink)

    def listdir(self, path: str) -> list[tuple[str, Any]]:
        """A directory's entries with their own attributes (links not followed)."""
        with os.scandir(path) as entries:
            return [(e.name, e.stat(follow_symlinks=False)) for e in entries]

    def read(self, path: str, limit: int) -> bytes:
        """At most `limit` bytes of a file, never through a link."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            return fh.read(limit)


def file_pieces(path: str, want: int) -> Generator[bytes, None, None]:
    """A regular file of this machine (never through a link: a file a runner replaced by a
    link to /dev/zero or another's file is refused), in pieces of at most PIECE bytes, to
    its end or until `want` bytes came; shared by `connection: local` and `--client local`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise HostError(f"cannot fetch {path}: {exc.strerror}", Kind.CONNECTION) from None
    with os.fdopen(fd, "rb", buffering=0) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HostError(f"cannot fetch {path}: not a regular file", Kind.UNTRUSTED)
        at = 0
        while at < want and (piece := fh.read(min(PIECE, want - at))):
            at += len(piece)
            yield piece


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
        """Write to the agent's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        """No more verbs."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def kill(self) -> None:
        """Kill the subprocess and reap it."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        """Close stdin and wait for the agent to exit (killed after 10 s)."""
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
        """The exit code once the agent exits (None if it does not within 10 s)."""
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None
        self._err_reader.join(timeout=5)
        return code


class LocalSession(Session):
    """`connection: local`: the same agent and the same script, run by `sh` here."""

    def _tree(self) -> tuple[interpreter.TreeReader, int, str]:
        return LocalTree(), os.geteuid(), os.path.expanduser("~")

    def _pieces(self, path: str, want: int) -> Generator[bytes, None, None]:
        """A regular file of this machine, never through a link, a piece at a time."""
        return file_pieces(path, want)

    def _upload(self, data: bytes, path: str) -> None:
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)

    def _start(self, script: str) -> AgentProcess:
        return LocalAgent(script)
