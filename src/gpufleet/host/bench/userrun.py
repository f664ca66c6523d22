"""A bench run whose client runs as the run_as user (issue 50): handed over, read back.

The runner sends the requests and writes the run's files; with `run_as: USER` it runs with
that user's rights, like the server it measures, in that user's own directory
(`~/.gpufleet-run/runs/RUN`, written by a child as the user: host/agent/runas.py). What it
needs of root's is handed to it, never a path into root's workdir: the plan, the prompts,
the server's state and keys as files in its own directory, the server's log as an open
descriptor. Root reads what the runner wrote only through descriptors: each directory and
file opened without following links, a file taken only when it is a regular file the user
owns, copied into root's own run directory when the run ends; the control plane fetches
from there, as for any run. The user can write what its own benchmark says (it runs the
server too), never make root read or write anywhere else.

Standard library only: this module ships in the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from gpufleet.host.agent import runas, safewrite
from gpufleet.host.agent.protocol import AgentError
from gpufleet.kinds import Kind, RunStatus

MARK = "user.json"  # in root's run directory: whose directory the run's files are in
# what root writes in its run directory and keeps: never taken from the user's copy
ROOTS_OWN = frozenset({"plan.json", "prompts.jsonl", "runner.json", "runner.log", MARK})
STATUS = "status.json"
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
LIMIT = 4 << 30  # bytes of one file taken back (a run's records run to tens of MB)


def hand_over(user: runas.RunAs, run_dir: Path, files: dict[str, str | bytes]) -> Path:
    """Write the runner's inputs (the agent itself among them) as the user into its own
    directory, under `runs/RUN/`; mark root's run directory with where they went; that
    directory (the runner's working directory)."""
    run = f"runs/{run_dir.name}"
    agent = Path(sys.argv[0]).read_bytes()
    home = user.write_files({"agent.pyz": agent, **{f"{run}/{k}": v for k, v in files.items()}})
    mark = {"user": user.name, "uid": user.uid, "dir": home}
    safewrite.write_atomic(run_dir / MARK, json.dumps(mark))
    return Path(home)


def owner_of(run_dir: Path) -> tuple[int, Path] | None:
    """(uid, the user's directory) where this run's runner ran as the run_as user."""
    data = safewrite.read_own(run_dir / MARK)
    if not data:
        return None
    mark = json.loads(data)
    return int(mark["uid"]), Path(mark["dir"])


@contextlib.contextmanager
def _user_run_dir(uid: int, home: Path, run_id: str) -> Iterator[int]:
    """A descriptor of the user's `runs/RUN` directory (`runs/` for an empty `run_id`), each
    level opened without following a link and owned by the user (its home directory's own
    path is the system's)."""
    fds: list[int] = []
    try:
        fds.append(os.open(home, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW))
        for part in ["runs", run_id] if run_id else ["runs"]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fds[-1]))
        for fd in fds:
            st = os.fstat(fd)
            if st.st_uid != uid or st.st_mode & 0o022:
                raise AgentError(f"{home}/runs/{run_id} is not the run_as user's own directory",
                                 kind=Kind.UNTRUSTED)  # fmt: skip
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def _open_file(dir_fd: int, name: str, uid: int) -> int | None:
    """A regular file of the user's, opened without following a link nor blocking on a
    FIFO; None where there is none such."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size > LIMIT:
        os.close(fd)
        return None
    return fd


def read(run_dir: Path, name: str, offset: int = 0, limit: int = LIMIT) -> bytes | None:
    """At most `limit` bytes of a file the user's runner wrote (from `offset`), or None."""
    owner = owner_of(run_dir)
    if owner is None:
        return None
    uid, home = owner
    try:
        with _user_run_dir(uid, home, run_dir.name) as dir_fd:
            fd = _open_file(dir_fd, name, uid)
            if fd is None:
                return None
            with os.fdopen(fd, "rb") as fh:
                fh.seek(offset)
                return fh.read(limit)
    except OSError:
        return None


def copy_keeping_holes(src: BinaryIO, dst: BinaryIO) -> None:
    """Copy a file the user wrote with its holes kept: a sparse file of LIMIT bytes takes
    the disk its data takes, not LIMIT (issue 68.5: root copied it whole)."""
    fd, size, pos = src.fileno(), os.fstat(src.fileno()).st_size, 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: nothing but a hole from here
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        os.lseek(fd, data, os.SEEK_SET)
        dst.seek(data)
        left = hole - data
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            dst.write(chunk)
            left -= len(chunk)
        pos = hole
    dst.truncate(size)


def _root_said_ended(run_dir: Path) -> bool:
    """Root's own status of the run says it ended (the runner died, or ran past its job's
    end and was ended: host/agent/jobdeadline.py): root's verdict, which the runner's
    last word ("running") must not overwrite, or the archive loses why."""
    try:
        own = json.loads(safewrite.read_own(run_dir / STATUS) or b"")
    except (OSError, ValueError, AgentError):
        return False
    return isinstance(own, dict) and own.get("status") in (RunStatus.DONE, RunStatus.FAILED)


def take_back(run_dir: Path, remove: bool = False) -> list[str]:
    """Copy every regular file the user's runner wrote into root's run directory (the
        names root keeps, and hidden ones, excepted, and the status where root's own says the run
    ended); the names copied. With `remove` (the run
        has ended), the user's run directory is emptied and removed after, entry by entry
        through its descriptor (an unlink never follows a link)."""
    owner = owner_of(run_dir)
    if owner is None:
        return []
    uid, home = owner
    taken: list[str] = []
    kept = ROOTS_OWN | ({STATUS} if _root_said_ended(run_dir) else set())
    try:
        with _user_run_dir(uid, home, run_dir.name) as dir_fd:
            names = sorted(os.listdir(dir_fd))
            for name in names:
                if name.startswith(".") or name in kept:
                    continue
                fd = _open_file(dir_fd, name, uid)
                if fd is None:
                    continue
                with os.fdopen(fd, "rb") as src, safewrite.open_fresh(run_dir / name) as dst:
                    copy_keeping_holes(src, dst)
                taken.append(name)
            if remove:
                for name in names:
                    with contextlib.suppress(OSError):  # a folder the user made: left
                        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return taken  # taken back and removed before (a second watch, --attach)
    if remove:
        with contextlib.suppress(OSError), _user_run_dir(uid, home, "") as runs_fd:
            os.rmdir(run_dir.name, dir_fd=runs_fd)
    return taken
