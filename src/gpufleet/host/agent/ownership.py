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
stopped, or whose runner ran past its job's end (it hung while it runs: the end recorded
at its start, host/agent/jobdeadline.py), never while the task's agent runs; the runner's
processes are ended either way (one left stopped was resumed by its user). A runner
started as a Slurm job step is no child of the agent: it is handed the lock's descriptor
over a Unix socket in its run directory (`hand_over`/`take_over`), so it owns the host on
srun as over SSH (issue 81.6); its job's end is Slurm's. Once the task's agent is gone, the
refusal names the run that holds the host now, never the task's dead pid as if it ran (81.8).
Standard library only: this module ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

from gpufleet.host.agent import bounded, jobdeadline, safewrite
from gpufleet.host.agent.procstat import ProcRef, read_stat
from gpufleet.host.agent.protocol import AgentError, Owner
from gpufleet.kinds import Kind
from gpufleet.wire import JsonDict

LOCK = "owner.lock"
RUNS = Path("runs")  # the runs' directories, under the workdir (host/bench/bench_verbs.py)
RECORD = "owner.json"
RECORD_BYTES = 64 << 10  # a runner.json the run's user may have written: a few hundred bytes
STOPPED = ("T", "t")  # /proc/PID/stat states: stopped by a signal, or by a tracer
HANDOVER_S = 2.0  # how long a claim waits for a keeper whose runner has just ended


class ProcWire(TypedDict):
    """A process on this host as owner.json names it (procstat.ProcRef's wire form)."""

    pid: int
    start_ticks: int


class RunnerWire(ProcWire, total=False):
    """A bench runner that runs as another user, that user, and when its job ends."""

    user: str
    ends_by: str  # jobdeadline.JobEnd's: said
    ends_boot_s: float  # and compared
    run: str  # its run's id: the run's status says why it ended


class Holding(Owner, total=False):
    """owner.json: the task that holds the host (its Owner), when it claimed it, its agent
    here (whether the task still runs), the process of root's that holds the lock here, and
    the bench runner it holds it for."""

    claimed: str
    agent: ProcWire | None
    holder: ProcWire | None
    runner: RunnerWire


_held: int | None = None  # the lock's descriptor, open for this agent's life
_owner: Owner | None = None
_record: Holding = {}  # type: ignore[typeddict-item]  # filled by claim


def claim(owner: Owner | None, take_over: bool = False, host: str = "") -> str | None:
    """Hold the host for `owner`'s task (a no-op where this agent already does, or where
    the holder is the same task's other session); AgentError (IN_USE) naming the holder.
    With `take_over` (gpu-clean), an owner whose holder or runner is stopped, or whose
    runner ran past its job's end, is ended and the host taken: the line saying so is
    returned. `host`: the inventory's name, for the refusal's `inv gpu-clean` line."""
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
        why = _ended(holder) if take_over and holder is not None else None
        if why is not None:
            said = f"took over this host from {_who(holder)}: {why}"
        if not _lock(fd, HANDOVER_S if said or _runner_ended(holder) else 0.0):
            os.close(fd)
            raise AgentError(busy_line(holder, host), kind=Kind.IN_USE)
    _held, _owner = fd, me
    me_here = ProcRef.capture(os.getpid())
    _record.clear()
    here = me_here.to_wire() if me_here else None
    _record.update({**me, "claimed": _now(), "agent": here, "holder": here})
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


def busy_line(holder: Holding | None, host: str = "") -> str:
    """The refusal: who holds the host now, and until when: the task while its agent lives,
    else the runs it left running (the lock is theirs), each freed when it ends, its job's
    end said; one past that end is said so, with the line that takes the host over."""
    if holder is None:
        return "this host is in use by another gpufleet task; it is freed when that task ends"
    task = _who(holder)
    runner = holder.get("runner")
    late = jobdeadline.past(runner)
    if isinstance(runner, dict) and late is not None and not _task_runs(holder):
        clean = f"inv gpu-clean --hosts {shlex.quote(host)}" if host else "inv gpu-clean"
        return (f"this host is held by {task}, whose bench runner (pid {runner.get('pid')} "
                f"as {runner.get('user')}) ran past its job's end ({runner.get('ends_by')}, "
                f"{late:.0f} s ago): `{clean}` takes the host over and ends it")  # fmt: skip
    ending = runner.get("ends_by") if isinstance(runner, dict) else None
    ends = f", its job ends by {ending}" if ending else ""
    run = (f"; its bench run goes on (runner pid {runner['pid']} as {runner['user']}{ends})"
           if isinstance(runner, dict) else "")  # fmt: skip
    agent = holder.get("agent")
    if not isinstance(agent, dict) or _alive(agent):
        return (f"this host is in use by {task}{run}; it is freed when that task ends (or is "
                "interrupted there): run this after it")  # fmt: skip
    runs = runs_holding()
    if not runs:
        return (f"this host is held by a process {task} left running{run}, which has ended; "
                "it is freed when that process ends: run this after it")  # fmt: skip
    first = runs[0].split(" ", 1)[0]
    return (
        f"this host is held by run {'; run '.join(runs)}, left running by {task}, which has "
        f"ended{ends}; it is freed when that run ends (`inv bench --attach {first}` waits for "
        "it and fetches it): run this after it"
    )


def _task_runs(holder: Holding) -> bool:
    """The task's agent still runs here (alive, not stopped): it holds the lock itself, so
    no take-over can have the host, and none may end what the task started."""
    ref = _ref(holder.get("agent"))
    stat = read_stat(ref.pid) if ref else None
    return bool(stat and stat.running and stat.start_ticks == ref.start_ticks
                and stat.state not in STOPPED)  # fmt: skip


def _alive(wire: Any) -> bool:
    try:
        return ProcRef.from_wire(wire).alive()
    except (KeyError, TypeError, ValueError):
        return True  # a record it cannot judge: say what it says


def _ref(data: Any) -> ProcRef | None:
    try:
        return ProcRef.from_wire(data) if isinstance(data, dict) else None
    except (KeyError, ValueError, TypeError):
        return None


def _stopped(holder: Holding) -> tuple[str, str] | None:
    """Why the holder cannot be waited for: its process here, or its run's runner, is
    stopped (SIGSTOP, a tracer), as (which, the line's words); None while both run."""
    for key, what in (("holder", "its holder"), ("runner", "its bench runner")):
        ref = _ref(holder.get(key))
        stat = read_stat(ref.pid) if ref else None
        if ref and stat and stat.start_ticks == ref.start_ticks and stat.state in STOPPED:
            user = holder[key].get("user")
            return key, f"{what} (pid {ref.pid}{f' as {user}' if user else ''}) is stopped"
    return None


def _ended(holder: Holding) -> str | None:
    """Why a gpu-clean takes the host over, once what held it is ended: its runner ran
    past its job's end, or its holder or runner is stopped; None where the owner still
    holds the host. A take-over ends the runner's group every time (stopped or not, past
    its end or not): one left behind, stopped, was resumed by its user with no lock while
    another task owned the host."""
    if _task_runs(holder):
        return None  # its agent holds the lock too: nothing ended would free the host
    runner, late = holder.get("runner"), jobdeadline.past(holder.get("runner"))
    ref = _ref(runner)
    if late is not None and ref is not None and ref.alive() and isinstance(runner, dict):
        user, ends_by = str(runner.get("user")), str(runner.get("ends_by"))
        why = f"its bench runner (pid {ref.pid} as {user}) ran past its job's end ({ends_by}, "
        why += f"{late:.0f} s ago)"
        said = jobdeadline.overdue(ref, user, ends_by)
        _end_holder(holder)  # its keeper, which would end with it anyway
    else:
        stopped = _stopped(holder)
        if stopped is None or not _end_holder(holder):
            return None
        which, why = stopped
        user = str(runner.get("user")) if isinstance(runner, dict) else ""
        said = f"its runner (pid {ref.pid if ref else '?'} as {user}) " + (
            "was stopped" if which == "runner" else f"lost the host ({why})"
        )
    if ref is None or not ref.alive() or not isinstance(runner, dict):
        return why
    ended = jobdeadline.end_group(ref)
    status = _status_of(runner.get("run"))
    jobdeadline.note_ended(status, said, by="`inv gpu-clean`", count=ended)
    return f"{why}: ended it ({ended} process{'es' if ended != 1 else ''})"


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
# descriptor and ends when the runner does (by PID and start time: never a reused PID), or
# ends the runner past its job's end (jobdeadline.keep); the agent's own code, from its zip
_KEEPER = """# gpufleet-owner-keeper
import sys
sys.path.insert(0, sys.argv[1])
from gpufleet.host.agent.jobdeadline import keep
keep(sys.argv[2:])
"""
_ROOT = str(Path(__file__).resolve().parents[3])  # the zipapp, or src/


def keep_for(
    runner: ProcRef, user: str, *, ends: jobdeadline.JobEnd | None = None, run: str = "",
    grace: float = jobdeadline.KEEPER_GRACE_S,
) -> None:  # fmt: skip
    """Hold the host for `runner` (a bench runner running as `user`, of run `run`) until
    it ends, in a keeper process of root's: the runner inherits nothing of root's lock, so
    stopping it holds the host for no one (a gpu-clean takes over, `claim`), nor does
    hanging past its job's end `ends` (recorded, said in every refusal; `grace` after it
    the keeper ends the runner itself)."""
    if _held is None:
        return
    until = str(ends["ends_boot_s"] + grace) if ends else ""
    argv = [str(runner.pid), str(runner.start_ticks), until, _status_of(run), user,
            ends["ends_by"] if ends else ""]  # fmt: skip
    keeper = subprocess.Popen(  # in the workdir: the run's status is written below it
        [sys.executable, "-I", "-S", "-c", _KEEPER, _ROOT, *argv],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        close_fds=True, pass_fds=(_held,), start_new_session=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )  # fmt: skip
    ref = ProcRef.capture(keeper.pid)
    _record.update({
        "holder": ref.to_wire() if ref else None,
        "runner": {**runner.to_wire(), "user": user, **(ends or {}), "run": run},
    })  # fmt: skip
    safewrite.write_atomic(RECORD, json.dumps(_record))


def _status_of(run: Any) -> str:
    """Root's status.json of run `run` (relative to the workdir), or nothing to write."""
    if not isinstance(run, str) or not run or "/" in run or run.startswith("."):
        return ""
    return str(RUNS / run / "status.json")


def runs_holding(runs: Path = RUNS) -> list[str]:
    """The runs whose runner is alive, each with where it is (`RUN (C=8, level 2 of 3,
    since T)`): what holds the host once the task that started them is gone."""
    found = []
    for record in sorted(runs.glob("*/runner.json")) if runs.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # TooLarge too
            if ProcRef.from_wire(json.loads(bounded.read_file(record, RECORD_BYTES))).alive():
                found.append(record.parent.name + _where(record.parent))
    return found


def _where(run_dir: Path) -> str:
    """` (C=8, level 2 of 3, since T)` from the run's plan and progress, or nothing."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        levels = json.loads(bounded.read_file(run_dir / "plan.json", bounded.RUN_LOOK))["levels"]
        with open(run_dir / "progress.jsonl", "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
            lines = bounded.take(fh, 65536).decode(errors="replace").splitlines()
        starts = [e for e in map(_event, lines) if e and e.get("phase") == "start"]
        last = starts[-1]
        level = int(last["level"])
        return f" (C={level}, level {len(starts)} of {len(levels)}, since {str(last['at'])[:40]})"
    return ""


def _event(line: str) -> JsonDict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


STEP_HANDOVER_S = 30.0  # how long bench-start waits for a job step's runner to take the lock


def hand_over(path: Path) -> socket.socket | None:
    """A Unix socket at `path` (in the run's 0700 directory) where the runner started as a
    job step takes this agent's lock; None where the agent holds nothing."""
    if _held is None:
        return None
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    return listener


def give(listener: socket.socket, path: Path, within: float = STEP_HANDOVER_S) -> bool:
    """Send the lock's descriptor to the first caller (the runner) within `within` seconds;
    whether it was taken. The socket is closed and removed either way."""
    try:
        if within <= 0:
            return False
        listener.settimeout(within)
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(within)
            assert _held is not None
            socket.send_fds(conn, [b"L"], [_held])
            return conn.recv(1) == b"K"  # the runner holds it: this agent may end
    except OSError:
        return False
    finally:
        listener.close()
        path.unlink(missing_ok=True)


_taken: int | None = None  # the lock as the runner holds it, open for the runner's life


def take_over(path: Path) -> bool:
    """In a runner started as a job step: take the lock its agent offers at `path` (if
    any) and hold it for this process's life; whether it was taken."""
    global _taken
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(STEP_HANDOVER_S)
            conn.connect(str(path))
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            if not fds:
                return False
            _taken = fds[0]
            conn.sendall(b"K")
            return True
    except OSError:
        return False
