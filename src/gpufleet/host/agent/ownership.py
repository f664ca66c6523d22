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
its first. A runner started as a Slurm job step is no child of the agent: it is handed the
lock's descriptor over a Unix socket in its run directory (`hand_over`/`take_over`), so it
owns the host on srun as over SSH (issue 81.6). Once the task's agent is gone, the refusal
names the run that holds the host now, never the task's dead pid as if it ran (81.8).
Standard library only: this module ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path

from gpufleet.host.agent import bounded, safewrite
from gpufleet.host.agent.procstat import ProcRef
from gpufleet.host.agent.protocol import AgentError, Owner
from gpufleet.kinds import Kind
from gpufleet.wire import JsonDict

LOCK = "owner.lock"
RECORD = "owner.json"
RECORD_BYTES = 64 << 10  # a runner.json the run's user may have written: a few hundred bytes

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
    agent = ProcRef.capture(os.getpid())  # whether the task still holds it, for busy_line
    safewrite.write_atomic(RECORD, json.dumps({**me, "agent": agent and agent.to_wire()}))


def holder_now() -> Owner | None:
    """What owner.json says of the task that holds (or last held) the host."""
    with contextlib.suppress(OSError, ValueError, AgentError):
        data = safewrite.read_own(RECORD)
        if data:
            return json.loads(data)
    return None


def busy_line(holder: Owner | None) -> str:
    """The refusal: who holds the host now, and until when: the task while its agent lives,
    else the runs it left running (the lock is theirs), each freed when it ends."""
    if holder is None:
        return "this host is in use by another gpufleet task; it is freed when that task ends"
    where = f" on {holder['control']}" if holder.get("control") else ""
    since = f", since {holder['since']}" if holder.get("since") else ""
    task = f"`{holder['task']}` (pid {holder['pid']}{where}{since})"
    agent = holder.get("agent")
    if not isinstance(agent, dict) or _alive(agent):
        return (f"this host is in use by {task}; it is freed when that task ends (or is "
                "interrupted there): run this after it")  # fmt: skip
    runs = runs_holding()
    if not runs:
        return (f"this host is held by a process {task} left running, which has ended; "
                "it is freed when that process ends: run this after it")  # fmt: skip
    first = runs[0].split(" ", 1)[0]
    return (
        f"this host is held by run {'; run '.join(runs)}, left running by {task}, which has "
        f"ended; it is freed when that run ends (`inv bench --attach {first}` waits for it "
        "and fetches it): run this after it"
    )


def _alive(wire: dict[str, int]) -> bool:
    try:
        return ProcRef.from_wire(wire).alive()
    except (KeyError, TypeError, ValueError):
        return True  # a record it cannot judge: say what it says


def runs_holding(runs: Path = Path("runs")) -> list[str]:
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


def held_fd() -> int | None:
    """The lock's descriptor, for a detached child that must own the host after this
    agent ends (the bench runner); None where this agent holds nothing."""
    return _held


HANDOVER_S = 30.0  # how long bench-start waits for a job step's runner to take the lock


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


def give(listener: socket.socket, path: Path, within: float = HANDOVER_S) -> bool:
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
            conn.settimeout(HANDOVER_S)
            conn.connect(str(path))
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            if not fds:
                return False
            _taken = fds[0]
            conn.sendall(b"K")
            return True
    except OSError:
        return False
