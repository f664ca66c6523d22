"""A bench run's job end as the host's lock records it, and the end of a runner past it.

A run_as runner that hangs while it still runs (state R or S: a stopped client process, a
read that never returns) held the host forever (issue 80.5). Its job has an end
(host/bench/jobend.py); owner.json records it twice: on the boot clock (CLOCK_BOOTTIME,
which the start ticks of /proc count on too, and which no one's setting the wall clock
moves), what is compared, and on the wall clock, what is said. Past it, a gpu-clean ends
the runner's process group and session at once (the operator asked: host/agent/
ownership.py), and root's keeper of the lock does KEEPER_GRACE_S later where nobody did
(an unattended host gets itself back); the run's status says why. Either ends the very
processes: each is held by a pidfd and checked (its start time, its group or session,
its user) before the one signal, so a reused PID is never hit, and nothing of root's.
Standard library only: it ships.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from gpufleet.host.agent import safewrite
from gpufleet.host.agent.procstat import ProcRef, ProcStat, all_stats, read_stat
from gpufleet.host.agent.protocol import AgentError
from gpufleet.kinds import RunStatus

ENDED_WAIT_S = 5.0  # how long the runner's processes get to be gone after SIGKILL
# after the job's end, how long the keeper leaves a gpu-clean (said in every refusal) to
# take the host over before it ends the runner itself
KEEPER_GRACE_S = 600.0
KEEPER_POLL_S = 0.2


class JobEnd(TypedDict):
    """When the run's job ends at the latest: said (UTC, to the second), and compared."""

    ends_by: str
    ends_boot_s: float


def boot_now() -> float:
    """Seconds since boot, suspend included: one clock for every process of the host."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def job_end(seconds: float) -> JobEnd:
    """The end of a job that may last `seconds` from now."""
    wall = datetime.now(UTC) + timedelta(seconds=seconds)
    said = wall.isoformat(timespec="seconds").replace("+00:00", "Z")
    return {"ends_by": said, "ends_boot_s": round(boot_now() + seconds, 3)}


def past(record: Any) -> float | None:
    """Seconds a recorded runner is past its job's end; None before it (or with no end:
    a record from before job ends, or one this cannot read, holds as it did)."""
    if not isinstance(record, dict):
        return None
    end = record.get("ends_boot_s")
    if not isinstance(end, int | float) or isinstance(end, bool):
        return None
    late = boot_now() - float(end)
    return late if late >= 0 else None


def end_group(runner: ProcRef) -> int:
    """SIGKILL the runner and every process of its group or its session (it leads both:
    it was started in a session of its own; a process that moved to a group of its own
    stays in the session) that started after it and runs as its user, never root; how
    many were signalled. Returns once they are gone (at most ENDED_WAIT_S)."""
    held: list[int] = []
    try:
        with contextlib.suppress(OSError):
            held.append(os.pidfd_open(runner.pid))
        uid = _uid(runner.pid)
        if not held or not runner.alive() or uid in (None, 0):
            return 0  # checked with the pidfd held: the PID cannot change hands now
        for stat in _members(runner.pid):
            if stat.pid != runner.pid and stat.start_ticks >= runner.start_ticks:
                with contextlib.suppress(OSError):
                    fd = os.pidfd_open(stat.pid)
                    again = read_stat(stat.pid)
                    same = again is not None and again.start_ticks == stat.start_ticks
                    if same and runner.pid in (again.pgid, again.session) and _uid(stat.pid) == uid:
                        held.append(fd)
                    else:
                        os.close(fd)
        for fd in held:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        _wait_gone(held)
        return len(held)
    finally:
        for fd in held:
            os.close(fd)


def _members(leader: int) -> list[ProcStat]:
    """The running processes of `leader`'s group or session."""
    return [s for s in all_stats() if leader in (s.pgid, s.session) and s.running]


def _uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _wait_gone(fds: list[int]) -> None:
    """Until every pidfd says its process has exited, at most ENDED_WAIT_S."""
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    left, deadline = set(fds), time.monotonic() + ENDED_WAIT_S
    while left and time.monotonic() < deadline:
        for fd, _ in poll.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            left.discard(fd)
            poll.unregister(fd)


def note_ended(status: str, why: str, *, by: str, count: int) -> None:
    """Root's status of the run (`status`: its status.json, which a watcher reads before
    the runner's): failed, `why` its runner was ended (`its runner (pid R as U) ran past
    its job's end (T)`), by whom, how many processes."""
    reason = f"{why} and was ended by {by} ({count} process{'es' if count != 1 else ''})"
    if not status:
        return
    with contextlib.suppress(OSError, ValueError, AgentError):  # gone, or not root's
        safewrite.write_atomic(status, json.dumps({"status": RunStatus.FAILED, "reason": reason}))


def overdue(runner: ProcRef, user: str, ends_by: str) -> str:
    """Why a runner past its job's end is ended, as the run's status says it."""
    return f"its runner (pid {runner.pid} as {user}) ran past its job's end ({ends_by})"


def keep(argv: list[str]) -> None:
    """Root's keeper of the host's lock for a runner of another user's (ownership.keep_for):
    `PID START UNTIL STATUS USER ENDS_BY`: it holds the lock until the runner ends, or,
    past UNTIL (the boot clock; empty: no end), ends the runner's group itself and says so
    in the run's STATUS file."""
    pid, start, until, status, user, ends_by = argv
    runner = ProcRef(int(pid), int(start))
    limit = float(until) if until else None
    while runner.alive():
        if limit is not None and boot_now() >= limit:
            count = end_group(runner)
            by = "root's keeper of the host"
            note_ended(status, overdue(runner, user, ends_by), by=by, count=count)
            return
        time.sleep(KEEPER_POLL_S)
