"""One SSH connection, and one serving agent, per host for a whole task.

A task can fan out several times over the same hosts (a sweep: one round per arm; a
tune: per phase). Inside `for_task()` (every CLI task runs in one), `run_on_hosts` takes
each host's session from here and puts it back, so the second round reuses the first
round's connection and agent instead of a new handshake, login and Python per host.
A session whose connection died is dropped; the next round opens a fresh one.
Light on purpose: the CLI wrapper imports it for every task, `inv --list` included.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpufleet.control.connect import taskid

if TYPE_CHECKING:
    from gpufleet.control.connect.base import Session
    from gpufleet.control.inventory.model import Host


class SessionPool:
    """Idle sessions by host name; a session is lent to one worker at a time."""

    def __init__(self) -> None:
        self._idle: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.opened = 0  # sessions opened during the task (benchmarks, tests)

    def take(self, host: Host) -> Session:
        """This host's idle session if it is still alive, else a new one."""
        with self._lock:
            session = self._idle.pop(host.name, None)
        if session is not None and session.host == host and session.alive:
            return session
        if session is not None:
            close_quietly(session)
        session = open_session(host)
        with self._lock:
            self.opened += 1
        return session

    def give_back(self, session: Session) -> None:
        """Keep a live session for the next round; close a dead one."""
        if not session.alive:
            close_quietly(session)
            return
        with self._lock:
            previous = self._idle.pop(session.host.name, None)
            self._idle[session.host.name] = session
        if previous is not None:  # two rounds at once on one host: keep one
            close_quietly(previous)

    def close(self) -> None:
        """Close every idle session (the task is over)."""
        with self._lock:
            sessions, self._idle = list(self._idle.values()), {}
        for session in sessions:
            close_quietly(session)


def close_quietly(session: Session) -> None:
    """Close a session whose connection may already be gone."""
    with contextlib.suppress(Exception):
        session.close()


_current: SessionPool | None = None


def current() -> SessionPool | None:
    """The running task's pool, if the task runs inside `for_task()`."""
    return _current


@contextlib.contextmanager
def for_task(name: str | None = None) -> Iterator[SessionPool]:
    """Keep sessions open across the task's rounds; close them all when it ends. `name`
    (`inv sweep`) is how another task's refusal names this one."""
    global _current
    outer, pool = _current, SessionPool()
    _current = pool
    if name:
        taskid.name(name)
    try:
        yield pool
    finally:
        _current = outer
        pool.close()


def open_session(host: Host) -> Session:
    """A host's session by its `connection:` (control/inventory/connections.py chooses)."""
    from gpufleet.control.inventory.connections import session_class

    return session_class(host)(host)
