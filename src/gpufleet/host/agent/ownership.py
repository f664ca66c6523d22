"""One owner per host at a time: the task whose agent holds `<workdir>/owner.lock`.

Two sweeps on one host each cleaned the GPUs before their next cell, so each killed the
other's loading server. Now every verb that changes the host (a launch, a bench, a
gpu-clean, a stop: `VerbArgs.changes_host`) first takes an exclusive `flock` on the lock
file and keeps it open for the agent's life. The lock is the agent's open file, so it ends
when the agent does, and the agent ends when its task's connection does (the task's end,
Ctrl-C, a crash, a lost network): nothing expires, nothing is left to clean up. A bench
runner started detached inherits it (`held_fd`), so a run that outlives its task still
owns the host until it ends. A second task's verb that would change the host is refused in
one line naming the owner (`owner.json`); reading (status, logs, `--attach`) never asks.
Sessions of one task share its identity, so a task's second connection is not refused by
its first. Standard library only: this module ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from gpufleet.host.agent import safewrite
from gpufleet.host.agent.protocol import AgentError, Owner
from gpufleet.kinds import Kind

LOCK = "owner.lock"
RECORD = "owner.json"

_held: int | None = None  # the lock's descriptor, open for this agent's life
_owner: Owner | None = None


def claim(owner: Owner | None) -> None:
    """Hold the host for `owner`'s task (a no-op where this agent already does, or where
    the holder is the same task's other session); AgentError (IN_USE) naming the holder."""
    global _held, _owner
    if _held is not None:
        return
    me: Owner = owner or {"id": f"agent {os.getpid()}", "task": "an agent call",
                          "control": "", "pid": os.getpid(), "since": ""}  # fmt: skip
    fd = safewrite.open_lock(LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = holder_now()
        if holder is not None and holder.get("id") == me["id"]:
            return  # this task's other session holds it
        raise AgentError(busy_line(holder), kind=Kind.IN_USE) from None
    _held, _owner = fd, me
    safewrite.write_atomic(RECORD, json.dumps(me))


def holder_now() -> Owner | None:
    """What owner.json says of the task that holds (or last held) the host."""
    with contextlib.suppress(OSError, ValueError, AgentError):
        data = safewrite.read_own(RECORD)
        if data:
            return json.loads(data)
    return None


def busy_line(holder: Owner | None) -> str:
    """The refusal: who holds the host, and that it is freed when that task ends."""
    if holder is None:
        return "this host is in use by another gpufleet task; it is freed when that task ends"
    where = f" on {holder['control']}" if holder.get("control") else ""
    since = f", since {holder['since']}" if holder.get("since") else ""
    return (
        f"this host is in use by `{holder['task']}` (pid {holder['pid']}{where}{since}); it is "
        "freed when that task ends (or is interrupted there): run this after it"
    )


def held_fd() -> int | None:
    """The lock's descriptor, for a detached child that must own the host after this
    agent ends (the bench runner); None where this agent holds nothing."""
    return _held
