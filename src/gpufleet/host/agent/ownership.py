"""One owner per host at a time: the task whose agent holds `<workdir>/owner.lock`.

Two sweeps on one host each cleaned the GPUs before their next cell, so each killed the
other's loading server. Now every verb that changes the host (a launch, a bench, a
gpu-clean, a stop: `VerbArgs.changes_host`) first takes an exclusive `flock` on the lock
file and keeps it open for the agent's life. The lock is the agent's open file, so it ends
when the agent does, and the agent ends when its task's connection does (the task's end,
Ctrl-C, a crash, a lost network): nothing expires, nothing is left to clean up. A second
task's verb that would change the host is refused in one line naming the owner
(`owner.json`: the task, its holder on this host, since when); reading (status, logs,
`--attach`) never asks. Sessions of one task share its identity, so a task's second
connection is not refused by its first.

A bench run outlives its task and owns the host until it ends. A runner of root's inherits
the lock (`held_fd`); a runner that runs as the run_as user never holds anything of root's
(issue 80.5: that user stopping its runner kept the host "in use" for root's gpu-clean):
root keeps the lock in a keeper of its own (`keep_for`) that ends with the runner. A
gpu-clean takes the host over, in one line, from an owner whose holder or runner is
stopped. Standard library only: this module ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any, TypedDict

from gpufleet.host.agent import safewrite
from gpufleet.host.agent.procstat import ProcRef, read_stat
from gpufleet.host.agent.protocol import AgentError, Owner
from gpufleet.kinds import Kind

LOCK = "owner.lock"
RECORD = "owner.json"
STOPPED = ("T", "t")  # /proc/PID/stat states: stopped by a signal, or by a tracer
HANDOVER_S = 2.0  # how long a claim waits for a keeper whose runner has just ended


class ProcWire(TypedDict):
    """A process on this host as owner.json names it (procstat.ProcRef's wire form)."""

    pid: int
    start_ticks: int


class RunnerWire(ProcWire):
    """A bench runner that runs as another user, and that user."""

    user: str


class Holding(Owner, total=False):
    """owner.json: the task that holds the host (its Owner), when it claimed it, the
    process of root's that holds the lock here, and the bench runner it holds it for."""

    claimed: str
    holder: ProcWire | None
    runner: RunnerWire


_held: int | None = None  # the lock's descriptor, open for this agent's life
_owner: Owner | None = None
_record: Holding = {}  # type: ignore[typeddict-item]  # filled by claim


def claim(owner: Owner | None, take_over: bool = False) -> str | None:
    """Hold the host for `owner`'s task (a no-op where this agent already does, or where
    the holder is the same task's other session); AgentError (IN_USE) naming the holder.
    With `take_over` (gpu-clean), an owner whose holder or runner is stopped is ended and
    the host taken: the line saying so is returned."""
    global _held, _owner
    if _held is not None:
        return None
    me: Owner = owner or {"id": f"agent {os.getpid()}", "task": "an agent call",
                          "control": "", "pid": os.getpid(), "since": ""}  # fmt: skip
    fd = safewrite.open_lock(LOCK)
    said = None
    if not _lock(fd, 0.0):
        holder = holder_now()
        if holder is not None and holder.get("id") == me["id"]:
            os.close(fd)
            return None  # this task's other session holds it
        why = _stopped(holder) if take_over and holder is not None else None
        if why is not None and _end_holder(holder):
            said = f"took over this host from {_who(holder)}: {why}"
        if not _lock(fd, HANDOVER_S if said or _runner_ended(holder) else 0.0):
            os.close(fd)
            raise AgentError(busy_line(holder), kind=Kind.IN_USE)
    _held, _owner = fd, me
    me_here = ProcRef.capture(os.getpid())
    _record.clear()
    _record.update({**me, "claimed": _now(), "holder": me_here.to_wire() if me_here else None})
    safewrite.write_atomic(RECORD, json.dumps(_record))
    return said


def _lock(fd: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def holder_now() -> Holding | None:
    """What owner.json says of the task that holds (or last held) the host: its Owner,
    when it claimed the host, its holder here and its bench runner, if any."""
    with contextlib.suppress(OSError, ValueError, AgentError):
        data = safewrite.read_own(RECORD)
        if data:
            found = json.loads(data)
            return found if isinstance(found, dict) else None
    return None


def _who(holder: Holding) -> str:
    where = f" on {holder['control']}" if holder.get("control") else ""
    since = holder.get("claimed") or holder.get("since")
    since = f", since {since}" if since else ""
    return f"`{holder.get('task')}` (pid {holder.get('pid')}{where}{since})"


def busy_line(holder: Holding | None) -> str:
    """The refusal: who holds the host, and that it is freed when that task ends."""
    if holder is None:
        return "this host is in use by another gpufleet task; it is freed when that task ends"
    runner = holder.get("runner")
    run = (f"; its bench run goes on (runner pid {runner['pid']} as {runner['user']})"
           if isinstance(runner, dict) else "")  # fmt: skip
    return (
        f"this host is in use by {_who(holder)}{run}; it is freed when that task ends (or is "
        "interrupted there): run this after it"
    )


def _ref(data: Any) -> ProcRef | None:
    try:
        return ProcRef.from_wire(data) if isinstance(data, dict) else None
    except (KeyError, ValueError, TypeError):
        return None


def _stopped(holder: Holding) -> str | None:
    """Why the holder cannot be waited for: its process here, or its run's runner, is
    stopped (SIGSTOP, a tracer); None while both run."""
    for key, what in (("holder", "its holder"), ("runner", "its bench runner")):
        ref = _ref(holder.get(key))
        stat = read_stat(ref.pid) if ref else None
        if ref and stat and stat.start_ticks == ref.start_ticks and stat.state in STOPPED:
            user = holder[key].get("user")
            return f"{what} (pid {ref.pid}{f' as {user}' if user else ''}) is stopped"
    return None


def _runner_ended(holder: Holding | None) -> bool:
    """The holder's run is over (its keeper is about to let go): worth a moment's wait."""
    ref = _ref((holder or {}).get("runner"))
    return ref is not None and not ref.alive()


def _end_holder(holder: Holding) -> bool:
    """SIGKILL the root process that holds the lock for a stopped owner (a keeper, or a
    stopped agent of root's): only the very process recorded, and only root's."""
    ref = _ref(holder.get("holder"))
    if ref is None or not ref.alive():
        return False
    try:
        if os.stat(f"/proc/{ref.pid}").st_uid != os.geteuid():
            return False
        os.kill(ref.pid, signal.SIGKILL)
    except OSError:
        return False
    return True


def held_fd() -> int | None:
    """The lock's descriptor, for a detached child of root's that must own the host after
    this agent ends (root's bench runner); None where this agent holds nothing. Never for
    a child that runs as another user: `keep_for`."""
    return _held


# root's keeper of the lock for a runner of another user's: it holds only the lock's
# descriptor and ends when the runner does (by PID and start time: never a reused PID)
_KEEPER = """# gpufleet-owner-keeper
import sys, time
pid, start = int(sys.argv[1]), sys.argv[2]
def same():
    try:
        raw = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0] not in ("Z", "X") and fields[19] == start
while same():
    time.sleep(0.2)
"""


def keep_for(runner: ProcRef, user: str) -> None:
    """Hold the host for `runner` (a bench runner running as `user`) until it ends, in a
    keeper process of root's: the runner inherits nothing of root's lock, so stopping it
    holds the host for no one (a gpu-clean takes over, `claim`)."""
    if _held is None:
        return
    keeper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _KEEPER, str(runner.pid), str(runner.start_ticks)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, pass_fds=(_held,), start_new_session=True, cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )  # fmt: skip
    ref = ProcRef.capture(keeper.pid)
    _record.update({
        "holder": ref.to_wire() if ref else None,
        "runner": {**runner.to_wire(), "user": user},
    })  # fmt: skip
    safewrite.write_atomic(RECORD, json.dumps(_record))
