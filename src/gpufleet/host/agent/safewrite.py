"""Every file the agent writes on a host, written so that root never writes through a link.

The workdir is judged by the trust rule before the agent runs. Inside it, a directory
gpufleet did not create (or that someone loosened) is judged again before use: it must be
a real directory, not a link, owned by this user and writable by nobody else; otherwise
the write is refused, not redirected. Files are opened with O_NOFOLLOW; whole files are
written to a fresh temporary name (O_EXCL) and renamed over the target, and a rename
replaces a planted link instead of following it. This module is the one place in host/
that opens a file for writing (tests/test_trust_census.py holds the rest to it).
Standard library only: this module ships.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import IO

from gpufleet.host.agent import trust
from gpufleet.host.agent.protocol import AgentError
from gpufleet.kinds import Kind

NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _refuse(path: Path | str, st: os.stat_result, why: str) -> AgentError:
    where = os.path.abspath(path)
    return AgentError(
        f"refusing to write in {trust.describe(where, st)}: {why}; fix: rm -r {where} "
        "(gpufleet makes its own)",
        kind=Kind.UNTRUSTED,
    )


def _judge_own(path: Path, st: os.stat_result, kind: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, st, f"it is a symlink, not a {kind} of gpufleet's")
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISREG
    if not wanted(st.st_mode):
        raise _refuse(path, st, f"it is not a {kind}")
    if st.st_uid != os.geteuid():
        raise _refuse(path, st, "another user owns it")
    if trust.others_can_write(st):
        raise _refuse(path, st, "other users can write it")


def own_dir(path: str | Path) -> Path:
    """`path` as a directory only this user controls: each missing level made 0700, each
    existing one judged. A relative path is walked from the workdir (the agent's cwd)."""
    path = Path(path)
    if path.is_absolute():
        cwd = Path.cwd()
        if not path.is_relative_to(cwd):
            real = trust.judge(str(path), os.geteuid(), trust.DIRECTORY, "directory", create=True)
            return Path(real)
        path = path.relative_to(cwd)
    current = Path(".")
    for part in path.parts:
        if part in (".", ".."):
            raise AgentError(f"refusing to write in {path}: '{part}' in the path", Kind.UNTRUSTED)
        current = current / part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            pass
        _judge_own(current, os.lstat(current), "directory")
    return current


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o600) -> Path:
    """The whole file, atomically: a fresh temporary beside it, renamed over the name."""
    path = Path(path)
    directory = own_dir(path.parent)
    payload = data.encode() if isinstance(data, str) else data
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    try:
        tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dfd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
    finally:
        os.close(dfd)
    return path


def _open(path: str | Path, flags: int, text: bool, buffering: int = -1) -> IO:
    path = Path(path)
    own_dir(path.parent)
    try:
        fd = os.open(path, flags | NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP, ENOTDIR: a link sits where the file goes
            raise _refuse(path, os.lstat(path), "it is a symlink") from None
        raise
    st = os.fstat(fd)
    try:
        _judge_own(path, st, "file")
    except AgentError:
        os.close(fd)
        raise
    return os.fdopen(fd, ("a" if flags & os.O_APPEND else "w") + ("" if text else "b"), buffering)


def open_append(path: str | Path, text: bool = False, buffering: int = -1) -> IO:
    """A log to add to (created 0600), never through a link."""
    return _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, text, buffering)


def open_fresh(path: str | Path, text: bool = False) -> IO:
    """A file to write from its start (truncated), never through a link."""
    return _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, text)


def read_own(path: str | Path) -> bytes | None:
    """A file gpufleet wrote and reads back as it (a cache): its directories judged as for a
    write, the file itself this user's and writable by nobody else, never through a link;
    None if it is not there."""
    path = Path(path)
    own_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP, ENOTDIR
            raise _refuse(path, os.lstat(path), "it is a symlink") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        _judge_own(path, os.fstat(fh.fileno()), "file")
        return fh.read()


def open_lock(path: str | Path) -> int:
    """A lock file's descriptor (read-write, created 0600), never through a link."""
    own_dir(Path(path).parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    st = os.fstat(fd)
    try:
        _judge_own(Path(path), st, "file")
    except AgentError:
        os.close(fd)
        raise
    return fd
